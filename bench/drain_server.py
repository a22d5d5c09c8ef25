#!/usr/bin/env python3
"""The drain thread's delay of a real server's scheduler loop, at decode batches of 1, 32 and 256.

``bench/drain_gil.py`` models the scheduler loop; this measures SGLang's own.  One real server on
this CPU (``bench_server``: tiny DeepSeek-V3 + the identity EAGLE head, ``--enable-ctx-profile``)
with ``bench/drain_server_probe`` path-loaded: in the scheduler process it times every
``run_batch`` call (wall, the thread's CPU, its run-queue wait) and alternates windows of
``--window`` seconds with the recorder's drain thread held (**idle**: the records wait in its queue)
and running (**busy**, counted from when the held window's backlog is drained).

Per batch size, the client sends one ``/generate`` with that many prompts of ``--ctx`` random
tokens and ``--new`` output tokens each (greedy, ``ignore_eos``: the requests run side by side
to the end, so the decode batch is that size), again and again for ``--seconds``.  Then the probe
writes its samples, and per batch size the decode step-to-step times (two decode calls in a row in
one window, the batch at least 90% of the size) are compared, busy against idle:

* **wall**: the step's p50 and p99 (ms) and the added delay at p99, busy - idle, as % of the idle
  p50 step (the goal: at most 1%);
* **GIL %**: the same for the step's wall time less the scheduler thread's CPU and run-queue wait,
  which is what waiting for the GIL (and for a device, none here) leaves; the machine's other load
  is mostly taken out;
* **own %**: the same for the step's wall time less its run-queue wait only: the GIL wait and the
  scheduler thread's own CPU, which with ``--mode process`` includes the hand-off to the drain
  process (in thread mode the two agree but for the drain's effect on the thread's caches);
* **floor**: the same p99 difference between the idle windows of odd and even rounds: this
  machine's noise alone (a busy figure within it is not resolved).

And the drain's CPU µs per record in the busy windows at that size (the recorder's ``Cost``, as
``/ctx_profile/status`` reports it; with ``--mode process`` or ``ring`` the scheduler thread's hand-off
per item: the drain in a process of its own, ``drain_server_probe``, a design priced here, not the
package's).  Run it alone on the machine, under the server lock.  A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (another revision) wins
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import start_server  # noqa: E402

PROBE = Path(__file__).resolve().parent / "drain_server_probe"
IDLE, BUSY = 0, 1


def _post(url: str, body: dict, timeout: float = 900) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def probe_env(folder: str) -> dict[str, str]:
    """The env that path-loads the probe plugin (an entry point written into ``folder``)."""
    d = os.path.join(folder, "drain_server_probe-0.1.0.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: drain-server-probe\nVersion: 0.1.0\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write("[sglang.srt.plugins]\ndrain_server_probe = drain_server_probe:register\n")
    path = os.pathsep.join(x for x in (str(PROBE), folder, os.environ.get("PYTHONPATH", "")) if x)
    return {"PYTHONPATH": path, "CTXPROF_DRAIN_PROBE": folder}


def load(url: str, batch: int, ctx: int, new: int, seconds: float, seed: int) -> int:
    """Batches of ``batch`` prompts until ``seconds`` have passed; the number of batches sent."""
    rng, t_end, n = random.Random(seed), time.monotonic() + seconds, 0
    while time.monotonic() < t_end:
        ids = [[rng.randint(10, 3999) for _ in range(ctx)] for _ in range(batch)]
        _post(url + "/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": new, "temperature": 0, "ignore_eos": True}})
        n += 1
    return n


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def steps(samples: list, size: int) -> dict:
    """Decode step-to-step times at about ``size``, by mode: wall and GIL-wait lists (ms), and
    the idle ones split by window parity (the floor)."""
    out: dict = {"wall": {}, "gil": {}, "own": {}, "halves": ([], [])}
    for a, b in zip(samples, samples[1:]):
        mode, window, decode, n = a[0], a[1], a[2], a[3]
        if mode < IDLE or (b[0], b[1]) != (mode, window) or not (decode and b[2]):
            continue
        if not (0.9 * size <= n <= size):
            continue
        dwall, dcpu, drunq = b[4] - a[4], b[5] - a[5], b[6] - a[6]
        out["wall"].setdefault(mode, []).append(dwall / 1e6)
        gil = max(0, dwall - dcpu - drunq) / 1e6
        out["gil"].setdefault(mode, []).append(gil)
        out["own"].setdefault(mode, []).append(max(0, dwall - drunq) / 1e6)
        if mode == IDLE:
            out["halves"][window % 4 == 1].append(gil)  # idle windows are every other one
    return out


def drain_cost(samples: list, marks: list, size: int, busy: int = BUSY) -> float:
    """The drain's CPU µs per record over the ``busy`` windows whose decode steps were mostly at about
    ``size`` (each counted from its backlog drained to the next window)."""
    sizes: dict[int, list[int]] = {}
    for mode, window, decode, n, *_ in samples:
        if mode == busy and decode:
            sizes.setdefault(window, []).append(n)
    ns = records = 0
    for (w, mode, ns0, r0), (_, _, ns1, r1) in zip(marks, marks[1:]):
        got = sizes.get(w, [])
        if mode == busy and got and pct([0.9 * size <= n <= size for n in got], 0.5):
            ns, records = ns + ns1 - ns0, records + r1 - r0
    return ns / 1e3 / records if records else float("nan")


def summarize(samples: list, marks: list, size: int, busy: int = BUSY) -> dict:
    """One row: the ``busy`` windows (an arm's) against the idle ones, at about ``size``."""
    s = steps(samples, size)
    w, g, o = s["wall"], s["gil"], s["own"]
    wi, wb, gi, gb, oi, ob = (d.get(k, []) for d in (w, g, o) for k in (IDLE, busy))
    i50 = pct(wi, 0.5)
    row = {"batch": size, "arm": busy, "steps_idle": len(wi), "steps_busy": len(wb),
           "idle_p50_ms": i50, "idle_p99_ms": pct(wi, 0.99), "busy_p50_ms": pct(wb, 0.5), "busy_p99_ms": pct(wb, 0.99)}
    row["wall_p99_pct"] = (row["busy_p99_ms"] - row["idle_p99_ms"]) / i50 * 100
    row["gil_p50_pct"] = (pct(gb, 0.5) - pct(gi, 0.5)) / i50 * 100
    row["gil_p99_pct"] = (pct(gb, 0.99) - pct(gi, 0.99)) / i50 * 100
    row["own_p50_pct"] = (pct(ob, 0.5) - pct(oi, 0.5)) / i50 * 100
    row["own_p99_pct"] = (pct(ob, 0.99) - pct(oi, 0.99)) / i50 * 100
    h = s["halves"]
    row["gil_p99_floor_pct"] = abs(pct(h[0], 0.99) - pct(h[1], 0.99)) / i50 * 100 if all(h) else float("nan")
    row["drain_us_per_record"] = drain_cost(samples, marks, size, busy)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--seconds", type=float, default=60.0, help="load per batch size")
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--mode", choices=("thread", "process", "ring"), default="thread",
                    help="the drain: the recorder's thread, or a process of its own fed through a socket or a "
                         "shared-memory ring (priced, not the package's)")
    ap.add_argument("--arms", default="paced",
                    help="thread mode: the busy windows in turn, of paced (an accelerator's drain), whole (the "
                         "same without pauses) and batched (the CPU device's: whole looks every 80 ms)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--log", default=str(ROOT / ".cache" / "bench-logs" / "drain_server.log"))
    a = ap.parse_args()
    sizes = [int(x) for x in a.batches.split(",")]
    folder = tempfile.mkdtemp(prefix="drain-probe-")
    env = {**probe_env(folder), "CTXPROF_DRAIN_PROBE_WINDOW_S": str(a.window), "CTXPROF_DRAIN_PROBE_MODE": a.mode,
           "CTXPROF_DRAIN_PROBE_ARMS": a.arms}
    most = max(sizes)
    tokens = max(16384, 2 * most * (a.ctx + a.new + 64))
    srv = start_server(a.log, env=env, extra_args=["--max-running-requests", str(most),
                                                   "--max-total-tokens", str(tokens)])
    try:
        sent = {}
        for i, size in enumerate(sizes):
            sent[size] = load(srv.url, size, a.ctx, a.new, a.seconds, seed=1000 + i)
        Path(folder, "dump").touch()
        t0 = time.monotonic()
        while not list(Path(folder).glob("samples-*.json")) and time.monotonic() - t0 < 60:
            time.sleep(0.2)
    finally:
        srv.stop()
    files = sorted(Path(folder).glob("samples-*.json"))
    if not files:
        sys.exit(f"drain_server: the probe wrote no samples (is it loaded? see {a.log})")
    data = json.loads(files[0].read_text())
    arms = a.arms.split(",") if a.mode == "thread" else [a.mode]
    rows = [summarize(data["samples"], data["marks"], size, BUSY + k) for size in sizes for k in range(len(arms))]
    print(f"drain: {a.mode}; windows of {data['window_s']} s; batches sent per size: {sent}")
    print(f"{'batch':>5} {'arm':>6} {'steps i/b':>11} | {'idle p50':>8} {'p99':>7} | {'busy p50':>8} {'p99':>7} | "
          f"{'wall p99 %':>10} | {'GIL % p50':>9} {'p99':>6} {'floor':>6} | {'own % p50':>9} {'p99':>6} | "
          f"{'drain us/rec':>12}")
    for r in rows:
        print(f"{r['batch']:5d} {arms[r['arm'] - BUSY]:>6} {r['steps_idle']:5d}/{r['steps_busy']:<5d} | {r['idle_p50_ms']:8.2f} "
              f"{r['idle_p99_ms']:7.2f} | {r['busy_p50_ms']:8.2f} {r['busy_p99_ms']:7.2f} | "
              f"{r['wall_p99_pct']:10.2f} | {r['gil_p50_pct']:9.2f} {r['gil_p99_pct']:6.2f} "
              f"{r['gil_p99_floor_pct']:6.2f} | {r['own_p50_pct']:9.2f} {r['own_p99_pct']:6.2f} | "
              f"{r['drain_us_per_record']:12.0f}")
    if data.get("handoff_per_item"):
        print("hand-off per item on the scheduler thread (all windows): " + ", ".join(
            f"{k} {v:.3g} per item" if k == "dropped" else f"{k} {v / 1e3:.1f} us" if k != "bytes" else f"{v:.0f} bytes"
            for k, v in data["handoff_per_item"].items()))
    if data.get("child"):
        print(f"drain process at the end: {data['child']}")
    print("goal: p99 delay <= 1% of the step (GIL %: the wait left when the thread's CPU and run-queue wait "
          "are taken out; floor: idle against idle)")
    if a.out:
        Path(a.out).write_text(json.dumps({"mode": a.mode, "rows": rows, "sent": sent, "window_s": data["window_s"],
                                           "handoff_per_item": data.get("handoff_per_item"),
                                           "child": data.get("child")}, indent=1))


if __name__ == "__main__":
    main()
