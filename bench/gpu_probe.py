#!/usr/bin/env python3
"""GPU probes: what reading torch and SGLang could not settle about CUDA events in graphs.

torch only (no SGLang, no network); written for an H200 with torch 2.11 and Python 3.12.  Each
probe runs in its own subprocess (a sticky CUDA error cannot poison the rest; P6, the one most
likely to leave one, runs last) and writes ``OUT/<probe>.json``; ``OUT/summary.json`` lists them
all.  The whole run takes well under 5 minutes.

* P0  torch, CUDA, driver, device, Python, and ``Event(external=True)`` support;
* P1  ``query()`` / ``elapsed_time`` on external events recorded in capture, before the first replay;
* P2  the latest replay wins (event times move with each replay);
* P3  a replay in flight (behind ``torch.cuda._sleep``): ``query()`` False without raising;
* P4  a plain (not external) event recorded in capture: what ``query`` / ``elapsed_time`` do;
* P5  start and end events on a forked and joined side stream inside the capture;
* P6  lifetime: delete a graph's events, then replay (error, silence, or handle reuse);
* P7  two graphs sharing one memory pool, replayed alternately, read per graph;
* P8  cost per event node: a graph of 512 tiny kernels with 0 / 128 / 512 event nodes (µs/node);
* P9  host µs per ``CudaEventClock.mark``, per ``elapsed_ms``, per ``GraphTimer.read`` of 120 regions;
* P10 our real ``GraphTimer`` in an overlap loop (forward stream, copy stream, the gate), see
  ``gpu_probe_overlap.py``.

``--dry-run`` runs every probe on the simulated device (CPU; ``make test`` does).  Usage:
``gpu_probe.py OUTDIR [--dry-run] [--only P1,P3]``.  Exit code 0 when every probe ran to completion
(what each found is in its JSON; P6 records an error as a finding, not a failure).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.modules.setdefault("sglang", None)  # the kit runs without SGLang, as on the GPU machine
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from probe_devices import make, outcome  # noqa: E402

ORDER = ("P0", "P1", "P2", "P3", "P4", "P5", "P7", "P8", "P9", "P10", "P6")  # P6 last
TIMEOUT_S = {"P8": 90, "P10": 90}


def _ext(D):
    return D.Event(enable_timing=True, external=True)


def _captured_pair(D, body, n_pairs=1):
    """A graph of ``body`` between external event pairs (eager warm-up first)."""
    body()
    D.synchronize()
    g = D.CUDAGraph()
    pairs = []
    with D.graph(g):
        for _ in range(n_pairs):
            s, e = _ext(D), _ext(D)
            s.record()
            body()
            e.record()
            pairs.append((s, e))
    return g, pairs


def p0(D):
    out = {"python": platform.python_version(), "device": D.name, "dry_run": D.dry}
    from sglang_ctxprof.collect.graph_clock import external_event_factory

    f, why = external_event_factory(D.Event)
    out["external_event_factory"] = {"ok": f is not None, "reason": why}
    if not D.dry:
        t = D.t
        out.update(torch=t.__version__, cuda=t.version.cuda, capability=list(t.cuda.get_device_capability()),
                   cycles_per_ms=D.cycles_per_ms)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            out["nvidia_smi"] = smi.stdout.strip()
        except Exception as exc:  # noqa: BLE001
            out["nvidia_smi"] = f"unavailable: {exc}"
    g, [(s, e)] = _captured_pair(D, D.tiny)
    g.replay()
    D.synchronize()
    out["external_record_in_capture_times"] = outcome(lambda: s.elapsed_time(e))
    return out


def p1(D):
    g, [(s, e)] = _captured_pair(D, lambda: D.spin(1.0))
    before = {"start_query": outcome(s.query), "end_query": outcome(e.query),
              "elapsed_time": outcome(lambda: s.elapsed_time(e))}
    g.replay()
    D.synchronize()
    after = {"start_query": outcome(s.query), "end_query": outcome(e.query),
             "elapsed_time": outcome(lambda: s.elapsed_time(e))}
    return {"before_first_replay": before, "after_replay_and_sync": after}


def p2(D):
    g, [(s, e)] = _captured_pair(D, D.tiny)
    m0 = D.Event(enable_timing=True)
    m0.record()
    g.replay()
    D.synchronize()
    a = m0.elapsed_time(s)
    D.spin(50.0)
    g.replay()
    D.synchronize()
    b = m0.elapsed_time(s)
    return {"marker_to_start_ms_replay1": a, "marker_to_start_ms_replay2_after_50ms_spin": b,
            "latest_replay_wins": b - a > 25.0}


def p3(D):
    g, [(s, e)] = _captured_pair(D, D.tiny)
    g.replay()
    D.synchronize()
    D.spin(200.0)
    g.replay()
    inflight = {"start_query": outcome(s.query), "end_query": outcome(e.query),
                "elapsed_time": outcome(lambda: s.elapsed_time(e))}
    D.synchronize()
    done = {"end_query": outcome(e.query), "elapsed_time": outcome(lambda: s.elapsed_time(e))}
    ok = inflight["end_query"] == {"value": False} and "raises" in inflight["elapsed_time"]
    return {"in_flight": inflight, "after_sync": done, "query_false_without_raising": ok}


def p4(D):
    D.tiny()
    D.synchronize()
    g = D.CUDAGraph()
    with D.graph(g):
        s, e = D.Event(enable_timing=True), D.Event(enable_timing=True)
        s.record()
        D.tiny()
        e.record()
    capture = {"query": outcome(s.query), "elapsed_time": outcome(lambda: s.elapsed_time(e))}
    g.replay()
    D.synchronize()
    return {"after_capture": capture, "after_replay": {"query": outcome(s.query),
                                                       "elapsed_time": outcome(lambda: s.elapsed_time(e))}}


def p5(D):
    side = D.Stream()
    D.spin(0.1)
    D.synchronize()
    g = D.CUDAGraph()
    with D.graph(g):
        main = D.current_stream()
        m = _ext(D)
        m.record()  # on the main branch, before the fork
        side.wait_stream(main)
        with D.stream(side):
            s, e = _ext(D), _ext(D)
            s.record(side)
            D.spin(2.0)
            e.record(side)
        main.wait_stream(side)
        D.tiny()
        j = _ext(D)
        j.record()
    g.replay()
    D.synchronize()
    return {"side_pair_ms": outcome(lambda: s.elapsed_time(e)), "main_to_side_end_ms": outcome(lambda: m.elapsed_time(e)),
            "side_start_to_main_after_join_ms": outcome(lambda: s.elapsed_time(j))}


def p6(D):
    g, pairs = _captured_pair(D, lambda: D.spin(1.0))
    g.replay()
    D.synchronize()
    del pairs
    gc.collect()
    fresh = [D.Event(enable_timing=True) for _ in range(4)]  # may reuse the destroyed handles
    for ev in fresh:
        ev.record()
    D.synchronize()
    t0 = [outcome(lambda ev=ev: fresh[0].elapsed_time(ev)) for ev in fresh]
    rep = outcome(lambda: (g.replay(), D.synchronize()) and None)
    after = [outcome(lambda ev=ev: fresh[0].elapsed_time(ev)) for ev in fresh]
    return {"replay_after_delete": rep, "fresh_events_before": t0, "fresh_events_after": after,
            "fresh_events_changed": t0 != after}


def p7(D):
    pool = D.graph_pool_handle()
    D.spin(0.1)
    D.synchronize()
    out, graphs = {}, {}
    for name, ms in (("large", 3.0), ("small", 1.0)):  # large first, as SGLang captures
        g = D.CUDAGraph()
        with D.graph(g, pool=pool):
            s, e = _ext(D), _ext(D)
            s.record()
            D.spin(ms)
            e.record()
        graphs[name] = (g, s, e)
    reads = []
    for i in range(6):
        name = ("large", "small")[i % 2]
        g, s, e = graphs[name]
        g.replay()
        D.synchronize()
        reads.append((name, s.elapsed_time(e)))
    for name in ("large", "small"):
        vals = [v for n, v in reads if n == name]
        out[name] = {"ms": vals, "min": min(vals), "max": max(vals)}
    out["separate"] = out["large"]["min"] > out["small"]["max"]
    return out


def p8(D, kernels=512, reps=40, rounds=5):
    def build(nodes):
        g = D.CUDAGraph()
        keep = []
        every = kernels // (nodes // 2) if nodes else 0
        with D.graph(g):
            for i in range(kernels):
                if every and i % every == 0:
                    s, e = _ext(D), _ext(D)
                    s.record()
                    D.tiny()
                    e.record()
                    keep.append((s, e))
                else:
                    D.tiny()
        return g, keep
    D.tiny()
    D.synchronize()
    graphs = {n: build(n) for n in (0, 128, 512)}
    times = {n: [] for n in graphs}
    a, b = D.Event(enable_timing=True), D.Event(enable_timing=True)
    for _ in range(rounds):
        for n, (g, _) in graphs.items():
            g.replay()
            D.synchronize()
            a.record()
            for _ in range(reps):
                g.replay()
            b.record()
            D.synchronize()
            times[n].append(a.elapsed_time(b) / reps)
    med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
    return {"kernels": kernels, "replay_ms_median": {str(n): m for n, m in med.items()},
            "us_per_node": {str(n): (med[n] - med[0]) * 1e3 / n for n in (128, 512)},
            "rel_cost": {str(n): (med[n] - med[0]) / med[0] for n in (128, 512)}}


def p9(D, n=2000, regions=120):
    from sglang_ctxprof.collect.clocks import CudaEventClock
    from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory
    from sglang_ctxprof.collect.step import StepBuilder

    clock = CudaEventClock(event_factory=lambda: D.Event(enable_timing=True))
    toks = [clock.mark() for _ in range(64)]
    for t in toks:
        clock.release(t)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        clock.release(clock.mark())
    mark_us = (time.perf_counter_ns() - t0) / n / 1e3
    x, y = clock.mark(), clock.mark()
    D.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        clock.elapsed_ms(x, y)
    elapsed_us = (time.perf_counter_ns() - t0) / n / 1e3
    f, _ = external_event_factory(D.Event)
    gt = GraphTimer(f, D.is_current_stream_capturing, sample_every=1)
    D.tiny()
    D.synchronize()
    g = D.CUDAGraph()
    gt.capture_begin("k")
    with D.graph(g):
        for i in range(regions):
            gt.region("verify_attn" if i % 2 else "verify_moe", D.tiny, (), {})
    gt.capture_end("k", True)
    reads = []
    for _ in range(20):
        b = StepBuilder("decode", 0)
        b.open.append("verify")
        gt.on_replay("k", b, gt.rule(0, "k") == "timed")
        g.replay()
        D.synchronize()
        t0 = time.perf_counter_ns()
        gt.read(b)
        reads.append((time.perf_counter_ns() - t0) / 1e3)
    return {"mark_us": mark_us, "elapsed_ms_us": elapsed_us, "graph_read_us_120_regions": sorted(reads)[10],
            "regions": regions, "read_ok": gt.sampled_reads == 20, "events": gt.events}


def p10(D):
    from gpu_probe_overlap import run_all

    return run_all(D)


PROBES = {"P0": p0, "P1": p1, "P2": p2, "P3": p3, "P4": p4, "P5": p5, "P6": p6, "P7": p7, "P8": p8,
          "P9": p9, "P10": p10}


def child(name, out_dir, dry):
    t0 = time.time()
    res = {"probe": name, "dry_run": dry}
    try:
        D = make(dry)
        res["result"] = PROBES[name](D)
        res["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a probe that broke says how
        import traceback

        res.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2000:])
    res["seconds"] = round(time.time() - t0, 3)
    Path(out_dir, f"{name}.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"{name}: {'ran' if res['ok'] else 'BROKE: ' + res['error']}", flush=True)
    return 0 if res["ok"] else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="folder for the JSON results")
    ap.add_argument("--dry-run", action="store_true", help="simulated device (CPU)")
    ap.add_argument("--only", default="", help="comma-separated probes, e.g. P1,P3")
    ap.add_argument("--probe", default="", help=argparse.SUPPRESS)  # the child's own run
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.probe:
        return child(a.probe, a.out, a.dry_run)
    names = [p for p in ORDER if not a.only or p in a.only.split(",")]
    unknown = set(a.only.split(",")) - set(PROBES) - {""}
    if unknown:
        ap.error(f"unknown probes {sorted(unknown)}; known: {', '.join(ORDER)}")
    summary, t0 = {"dry_run": a.dry_run, "probes": {}}, time.time()
    for name in names:
        cmd = [sys.executable, __file__, a.out, "--probe", name] + (["--dry-run"] if a.dry_run else [])
        t = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S.get(name, 60),
                                  env=dict(os.environ, PYTHONUNBUFFERED="1"))
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            rc, tail = 124, "timed out"
        summary["probes"][name] = {"rc": rc, "seconds": round(time.time() - t, 2),
                                   "json": Path(a.out, f"{name}.json").exists(), "tail": tail}
        print(f"{name}: rc={rc} {time.time() - t:.1f}s", flush=True)
    summary["seconds"] = round(time.time() - t0, 2)
    summary["ok"] = all(v["rc"] == 0 and v["json"] for v in summary["probes"].values())
    Path(a.out, "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"gpu_probe: {'every probe ran' if summary['ok'] else 'SOME PROBES BROKE'} in {summary['seconds']} s")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
