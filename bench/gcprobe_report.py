"""The reading side of ``bench/gcprobe``: which garbage collections of SGLang's processes fell in
which arm of ``reader_stall.py``, and which of them overlapped the arm's longest chunk gaps.

``bench/gcprobe/sitecustomize.py`` (in every server process, via ``PYTHONPATH``) writes one line
per generation-1/-2 collection to ``gc-<pid>.tsv``: generation, start, stop (``time.monotonic()``),
collected.  :func:`attribute` reads them back against the arms' windows and chunk times.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PROBE = Path(__file__).resolve().parent / "gcprobe"


def new_dir(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="gcprobe-", dir=parent))


def server_env(probe_dir: Path) -> dict[str, str]:
    """The probe folder first on PYTHONPATH (the code under test stays next), and where to write."""
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(PROBE) + (os.pathsep + path if path else ""), "CTXPROF_GC_PROBE_DIR": str(probe_dir)}


def roles(http_pid: int) -> dict[int, str]:
    """pid -> role (``http`` for SGLang's first process, else the process title: scheduler,
    detokenizer), read while the server still runs."""
    import psutil

    out = {http_pid: "http"}
    for c in psutil.Process(http_pid).children(recursive=True):
        try:
            title = " ".join(c.cmdline())
        except psutil.Error:
            continue
        out[c.pid] = ("scheduler" if "scheduler" in title else "detokenizer" if "detokenizer" in title
                      else f"child {c.pid}")
    return out


def read(probe_dir: Path) -> dict[int, list[tuple[int, float, float, int]]]:
    out = {}
    for f in Path(probe_dir).glob("gc-*.tsv"):
        rows = []
        for line in f.read_text().splitlines():
            g, a, b, c = line.split("\t")
            rows.append((int(g), float(a), float(b), int(c)))
        out[int(f.stem.split("-")[1])] = rows
    return out


def attribute(probe_dir: Path, roles: dict[int, str], results: list[dict], top: int = 3) -> dict:
    """Per arm run: per process the full collections in the stream's window (count, total and
    longest ms), and the ``top`` longest chunk gaps with the collections (gen >= 1) that overlap them."""
    gcs = read(probe_dir)
    name = {pid: roles.get(pid, f"pid {pid}") for pid in gcs}
    runs = []
    for k, r in enumerate(results):
        t0, t1, times = r["t0"], r["t1"], r["times"]
        procs = {}
        for pid, rows in gcs.items():
            full = [(b - a) * 1e3 for g, a, b, _ in rows if g == 2 and a < t1 and b > t0]
            young = [(b - a) * 1e3 for g, a, b, _ in rows if g == 1 and a < t1 and b > t0]
            procs[name[pid]] = {"gen2_n": len(full), "gen2_ms": sum(full), "gen2_max_ms": max(full, default=0.0),
                                "gen1_n": len(young), "gen1_max_ms": max(young, default=0.0)}
        gaps = sorted(((b - a, a, b) for a, b in zip(times, times[1:])), reverse=True)[:top]
        longest = []
        for d, a, b in gaps:
            hits = [f"{name[pid]} gen{g} {(e - s) * 1e3:.0f} ms" for pid, rows in gcs.items()
                    for g, s, e, _ in rows if s < b and e > a and (e - s) > 0.01]
            longest.append({"gap_ms": d * 1e3, "at_s": a - t0, "overlaps": hits})
        runs.append({"arm": r["arm"], "run": k, "procs": procs, "longest_gaps": longest})
    whole = {name[pid]: {"gen2_n": sum(1 for g, *_ in rows if g == 2),
                         "gen2_max_ms": max(((b - a) * 1e3 for g, a, b, _ in rows if g == 2), default=0.0)}
             for pid, rows in gcs.items()}
    return {"runs": runs, "whole_run": whole, "dir": str(probe_dir)}


def report(gc: dict) -> None:
    print("full (gen-2) collections during each stream, per process: n, total ms, max ms")
    arms: dict[str, dict[str, list[float]]] = {}
    for run in gc["runs"]:
        cells = "  ".join(f"{p}: {v['gen2_n']} / {v['gen2_ms']:.0f} / {v['gen2_max_ms']:.0f}"
                          for p, v in sorted(run["procs"].items()))
        print(f"  run {run['run']} {run['arm']:<8} {cells}")
        for g in run["longest_gaps"]:
            print(f"      gap {g['gap_ms']:6.0f} ms at +{g['at_s']:5.1f} s: "
                  f"{', '.join(g['overlaps']) or 'no collection over 10 ms overlaps'}")
        for p, v in run["procs"].items():
            a = arms.setdefault(run["arm"], {}).setdefault(p, [0, 0.0, 0.0])
            a[0] += v["gen2_n"]
            a[1] += v["gen2_ms"]
            a[2] = max(a[2], v["gen2_max_ms"])
    print("per arm, all runs (full collections n / total ms / max ms):")
    for arm, procs in arms.items():
        print(f"  {arm:<8} " + "  ".join(f"{p}: {n} / {t:.0f} / {m:.0f}" for p, (n, t, m) in sorted(procs.items())))
    print("whole run (start-up included), full collections: "
          + ", ".join(f"{p} {v['gen2_n']} (max {v['gen2_max_ms']:.0f} ms)" for p, v in sorted(gc["whole_run"].items())))
