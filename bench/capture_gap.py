#!/usr/bin/env python3
"""The scheduler's longest gap while a deep capture is stopped and exported, beside its p99 step.

Starts a tiny CPU server (DeepSeek-V3 + the identity EAGLE head, ``--enable-ctx-profile``; or uses
``--url``), keeps ``--concurrency`` generations running, asks for one capture of ``--steps`` steps
(``POST /ctx_profile/capture``, no key needed on the server started here), waits for it, and prints
one capture's numbers:

* steps, bytes, export time (the export thread), the scheduler thread's stop time (SGLang's
  ``_stop_profile`` with the export handed over; torch's ``stop()`` inside it);
* ``export_gap_ms``: the longest interval between two step starts from the stop until the export
  finished (measured in the scheduler by ``collect.capture``: it includes the stop itself);
* the p99 (and max) interval between step starts in the same run outside the capture window (from
  ``/ctx_profile/trace.json``), and the ratio of the two (the issue's goal: <= 1.5).

A benchmark, not a test: it prints numbers and asserts nothing about timing.  ``--json FILE`` writes
them.  Run it under the server lock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_server import start_server  # noqa: E402
from overhead import generate, http  # noqa: E402 - the same request loop as the overhead benchmark


def load(url: str, stop: threading.Event, seed: int, ctx: int, new: int) -> None:
    """Keep one generation running until ``stop``: fresh random prompts of ``ctx`` tokens."""
    import random

    rng = random.Random(seed)
    while not stop.is_set():
        try:
            generate(url, [rng.randint(10, 3999) for _ in range(ctx)], new)
        except (RuntimeError, OSError):
            pass  # a refused or dropped request is the server's news, not the load's


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))] if xs else 0.0


def measure(url: str, a: argparse.Namespace) -> dict:
    stop = threading.Event()
    threads = [threading.Thread(target=load, args=(url, stop, 100 + i, a.ctx, a.new), daemon=True)
               for i in range(a.concurrency)]
    for t in threads:
        t.start()
    time.sleep(a.warmup_s)
    status, body = http("POST", url + "/ctx_profile/capture?steps=" + str(a.steps))
    if status != 200:
        stop.set()
        raise SystemExit(f"capture refused: {status} {body}")
    cid = body["captures"][0]["id"]
    t0 = time.time()
    info = None
    while time.time() - t0 < 600:
        caps = http("GET", url + "/ctx_profile/status")[1]["ranks"][0]["status"]["capture"]["captures"]
        info = next(c for c in caps if c["id"] == cid)
        if info["state"] in ("done", "failed", "deleted"):
            break
        time.sleep(0.25)
    time.sleep(a.warmup_s / 2)
    stop.set()
    trace = http("GET", url + "/ctx_profile/trace.json?last=2048")[1]
    t0_ns = trace["otherData"]["t0_ns"]
    starts = sorted(t0_ns + int(e["ts"] * 1000) for e in trace["traceEvents"]
                    if e.get("ph") == "X" and e["name"] in ("decode step", "prefill"))
    lo, hi = info["start_ns"], info["end_ns"] + int((info["export_ms"] + 50) * 1e6)
    normal = [(b - a_) / 1e6 for a_, b in zip(starts, starts[1:]) if b < lo or a_ > hi]
    out = {k: info[k] for k in ("id", "state", "step_ids", "bytes", "stop_ms", "profiler_stop_ms",
                                "export_ms", "export_gap_ms", "export_steps", "error")}
    out.update({"p99_step_interval_ms": p99(normal), "max_step_interval_ms": max(normal, default=0.0),
                "intervals": len(normal), "concurrency": a.concurrency})
    out["gap_over_p99"] = out["export_gap_ms"] / out["p99_step_interval_ms"] if out["p99_step_interval_ms"] else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running server with --enable-ctx-profile (default: start a tiny one)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=300)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--json", help="write the numbers here")
    a = ap.parse_args(argv)
    if a.url:
        res = measure(a.url, a)
    else:
        log = ROOT / ".cache" / "bench-capture-gap.log"
        print(f"starting SGLang (log {log}) ...", flush=True)
        srv = start_server(log, quiet=False)
        try:
            res = measure(srv.url, a)
        finally:
            srv.stop()
    print(json.dumps(res, indent=1))
    print(f"capture {res['id']}: {len(res['step_ids'])} steps, {res['bytes']} bytes, export {res['export_ms']:.0f} ms "
          f"off the scheduler thread; scheduler thread stop {res['stop_ms']:.1f} ms (torch stop() "
          f"{res['profiler_stop_ms']:.1f} ms); longest step-start interval while exporting "
          f"{res['export_gap_ms']:.1f} ms vs p99 {res['p99_step_interval_ms']:.1f} ms outside the capture "
          f"(ratio {res['gap_over_p99'] or float('nan'):.2f}, {res['intervals']} intervals)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
