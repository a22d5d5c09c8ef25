#!/usr/bin/env python3
"""The drain thread's work on the request history as the batch grows, and what it leaves to the
garbage collector.

The fake speculative decode loop and the real profiler session of ``bench/drain_loop.py`` run
``--steps`` steps per batch size (as many again to warm up, so the request history is at its steady
size), with the drain thread stopped (and joined); then this thread drains the queue (``Recorder._consume`` /
``_feed_one``, as ``bench/drain_holds.py``).  Printed per batch: the drain's CPU µs per record
(``time.thread_time``), the collections of each generation and the longest collection (ms of wall
time) while the steps ran and drained, and the objects the collector tracks after, less before
(``len(gc.get_objects())``; a young collection runs at the end, none in full).  Which code runs is
whatever ``sglang_ctxprof`` the path finds first: run it from two checkouts one after the other to
compare.  A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import drain_loop as d  # noqa: E402
from sglang_ctxprof.testing.fake_worker import FakeWorker  # noqa: E402


def measure(n: int, steps: int) -> dict:
    d._Forward.ops = 0
    sess = d.session()
    sess.instrument()
    colls: Counter = Counter()
    pauses = [0.0]
    t0 = [0.0]

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            t0[0] = time.perf_counter()
        else:
            colls[info["generation"]] += 1
            pauses.append(time.perf_counter() - t0[0])

    try:
        sched, batch = d.Sched(FakeWorker(d._Forward().run)), d.Batch(n, 128)
        rec = sess.profiler.recorder

        batch.refill()
        sched.process_batch_result(batch, sched.run_batch(batch))  # binds: starts the drain thread
        thread = rec._thread
        rec.stop()
        if thread is not None:
            thread.join()  # never two threads draining: this one drains from here on

        def run_and_drain() -> float:
            for _ in range(steps):
                batch.refill()
                sched.process_batch_result(batch, sched.run_batch(batch))
            q, fan = rec._q, rec._fan
            c0 = time.thread_time()
            while q:
                rest = rec._consume(q.popleft())
                if rest is not None:
                    q.appendleft(rest)
            while fan:
                rest = rec._feed_one(fan.popleft())
                if rest is not None:  # the record's next sink: each sink's turn is a piece
                    fan.appendleft(rest)
            return time.thread_time() - c0

        run_and_drain()  # warm-up: the history at its steady size
        gc.collect()
        before = len(gc.get_objects())
        gc.callbacks.append(cb)
        cpu = run_and_drain()
        gc.callbacks.remove(cb)
        gc.collect(1)
        grown = len(gc.get_objects()) - before
    finally:
        sess.uninstrument()
    return {"batch": n, "us_per_record": cpu / steps * 1e6, "gen0": colls[0], "gen1": colls[1], "gen2": colls[2],
            "gc_max_ms": max(pauses) * 1e3, "tracked_grown": grown}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args(argv)
    print(f"{'batch':>5} | {'us/record':>9} | {'gen0':>4} {'gen1':>4} {'gen2':>4} | {'gc max ms':>9} | "
          f"{'tracked +':>9} | per step")
    for n in a.batches:
        r = measure(n, a.steps)
        print(f"{n:>5} | {r['us_per_record']:9.0f} | {r['gen0']:4} {r['gen1']:4} {r['gen2']:4} | {r['gc_max_ms']:9.1f} | "
              f"{r['tracked_grown']:9} | {r['tracked_grown'] / a.steps:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
