#!/usr/bin/env python3
"""The drain thread's GIL holds, in its own CPU time: how long one piece of its work runs.

``bench/drain_gil.py`` measures what the scheduler thread feels (wall time, GIL wait), which a busy
shared machine blurs.  This measures the cause, in this thread's CPU time (``time.thread_time_ns``,
which run-queue waits do not inflate): the same fake speculative decode loop and the real profiler
session with its default exporters (``drain_loop.session``) run ``--steps`` steps per batch size with
the drain thread held, then this thread drains the queue one piece at a time, as the drain thread's
slices do (``Recorder._consume``: a record's build, then each ``Aggregator.stages`` stage; then one
record's sinks, ``Recorder._feed_one``).  Printed per batch: the drain's CPU µs per record, the
pieces per record, the p99 and longest piece (µs) (``--by-kind``: each kind of piece apart, each
stage of a record's build and of its aggregation in order, each sink's turn), and the garbage collector's CPU time within the
longest piece (a collection runs on whichever thread allocates when it triggers, so it can fall in
any piece).  The self-audit's violations must stay 0.  ``--json FILE`` writes the rows.

A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import drain_loop as d  # noqa: E402
from sglang_ctxprof.testing.fake_worker import FakeWorker  # noqa: E402


class GcClock:
    """This thread's CPU ns spent in the garbage collector so far (a gc callback)."""

    def __init__(self) -> None:
        self.ns, self._t0 = 0, 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.thread_time_ns()
        else:
            self.ns += time.thread_time_ns() - self._t0


def measure(n: int, steps: int, gcc: GcClock) -> dict:
    d._Forward.ops = 0  # no forward: only the profiler's work is timed
    sess = d.session()
    sess.instrument()
    try:
        sched, batch = d.Sched(FakeWorker(d._Forward().run)), d.Batch(n, 128)
        rec = sess.profiler.recorder
        for _ in range(steps):  # warm-up: the request history at its steady size
            batch.refill()
            sched.process_batch_result(batch, sched.run_batch(batch))
        rec.stop()
        for _ in range(steps):
            batch.refill()
            sched.process_batch_result(batch, sched.run_batch(batch))
        tt, q, fan = time.thread_time_ns, rec._q, rec._fan
        records, pieces = len(q), []  # (cpu ns, gc ns)
        kinds: dict[str, list[int]] = {}  # piece kind -> its CPU ns: the build's or the aggregator's stage number
        stage = build = 0
        while q:
            item = q.popleft()
            kind = type(item).__name__
            if kind == "_Started":
                kind, stage = f"stage {stage}", stage + 1
            else:  # a record's build: one piece, or several (``build`` stages)
                if kind == "HostFacts" and getattr(item, "read", None) is None:
                    build = 0
                kind, stage, build = f"build {build}", 0, build + 1
            g, t0 = gcc.ns, tt()
            rest = rec._consume(item)
            pieces.append((tt() - t0, gcc.ns - g))
            kinds.setdefault(kind, []).append(pieces[-1][0])
            if rest is not None:
                q.appendleft(rest)
        while fan:
            item = fan.popleft()
            kind = "ends" if type(item).__name__ == "RequestEnd" else rec.sinks[getattr(item, "next", 0)].name
            g, t0 = gcc.ns, tt()
            rest = rec._feed_one(item)
            pieces.append((tt() - t0, gcc.ns - g))
            if rest is not None:  # the record's next sink: each sink's turn is a piece
                fan.appendleft(rest)
            kinds.setdefault(f"sink {kind}", []).append(pieces[-1][0])
        audit = sum(rec.aggregator.audit.status()["violations"].values())
    finally:
        sess.uninstrument()
    ns = sorted(p[0] for p in pieces)
    longest = max(pieces)
    return {"batch": n, "records": records, "us_per_record": sum(ns) / records / 1e3,
            "pieces_per_record": len(pieces) / records, "p99_piece_us": ns[int(0.99 * len(ns))] / 1e3,
            "longest_piece_us": longest[0] / 1e3, "gc_in_longest_us": longest[1] / 1e3,
            "audit_violations": audit,
            "by_kind": {k: {"n": len(v), "p50_us": sorted(v)[len(v) // 2] / 1e3,
                            "p99_us": sorted(v)[int(0.99 * len(v))] / 1e3, "max_us": max(v) / 1e3}
                    for k, v in kinds.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--steps", type=int, default=300, help="steps per batch size (and as many to warm up)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--by-kind", action="store_true", help="each kind of piece apart: the build, each stage, the sinks")
    a = ap.parse_args(argv)
    gcc = GcClock()
    gc.callbacks.append(gcc)
    print(f"{'batch':>5} | {'us/record':>9} | {'pieces/rec':>10} | {'p99 piece us':>12} | {'longest us':>10} | "
          f"{'gc in it us':>11} | audit")
    rows = []
    for n in a.batches:
        r = measure(n, a.steps, gcc)
        rows.append(r)
        print(f"{n:>5} | {r['us_per_record']:9.0f} | {r['pieces_per_record']:10.1f} | {r['p99_piece_us']:12.0f} | "
              f"{r['longest_piece_us']:10.0f} | {r['gc_in_longest_us']:11.0f} | {r['audit_violations']}", flush=True)
        if a.by_kind:
            for k, v in r["by_kind"].items():
                print(f"{'':>5}   {k:>22}: {v['n']:>6} pieces, p50 {v['p50_us']:7.1f} us, p99 {v['p99_us']:7.1f} us, "
                      f"max {v['max_us']:7.1f} us")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
