#!/usr/bin/env python3
"""Where the drain thread's CPU time per record goes: a cProfile of the drain at one batch size.

The same loop and profiler session as ``bench/drain_holds.py`` (the real default exporters, no
forward): ``--steps`` warm-up steps, then ``--steps`` more queued with the drain thread held, then
this thread drains them (``Recorder._consume`` for each piece, then ``Recorder._feed_one`` for each
sink hand-off) under cProfile.  Printed: the drain's CPU µs per record by part (record build,
aggregator stages, each sink by name, and a live metrics view as ``--enable-metrics`` has), timed with ``time.thread_time_ns`` outside the profiler,
then the profiler's top functions by own time; and the garbage collector's collections per 1000
records by generation (``gc.callbacks``).  A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import drain_loop as d  # noqa: E402
from sglang_ctxprof.model.records import StepRecord  # noqa: E402
from sglang_ctxprof.testing.fake_worker import FakeWorker  # noqa: E402


def queue_steps(sess, n: int, steps: int):
    d._Forward.ops = 0
    sched, batch = d.Sched(FakeWorker(d._Forward().run)), d.Batch(n, 128)
    rec = sess.profiler.recorder
    for _ in range(steps):
        batch.refill()
        sched.process_batch_result(batch, sched.run_batch(batch))
    rec.stop()
    for _ in range(steps):
        batch.refill()
        sched.process_batch_result(batch, sched.run_batch(batch))
    return rec


def metrics_view(rec):
    """A live Prometheus view on a registry of its own, as ``--enable-metrics`` has (the fake
    scheduler exports no metrics, so the session's metrics sink has no view)."""
    from prometheus_client import CollectorRegistry

    from sglang_ctxprof.views.metrics import MetricsView

    return MetricsView(rec.aggregator.bucketing, CollectorRegistry(), model="bench",
                       audit=lambda: rec.aggregator.audit.status()["violations"], counts=rec.aggregator.counts)


def parts(rec, view=None) -> tuple[int, Counter]:
    """Drain the queue by hand, timing each part (CPU ns); ``view`` a metrics view fed each record."""
    tt, q, fan, t = time.thread_time_ns, rec._q, rec._fan, Counter()
    records = sum(1 for x in q if type(x).__name__ != "RequestEnd")
    agg = rec.aggregator
    while q:
        item = q.popleft()
        if type(item).__name__ not in ("StepRecord", "RequestEnd", "_Started"):
            t0 = tt()
            r = item.record()
            t["build"] += tt() - t0
            item = r if r is not None else None
            if item is None:
                continue
        if type(item) is StepRecord:
            g = agg.stages(item)
            k = 0
            while True:
                try:
                    t0 = tt()
                    next(g)
                    t[f"aggregate stage {k}"] += tt() - t0
                    k += 1
                except StopIteration:
                    t[f"aggregate stage {k}"] += tt() - t0
                    break
            fan.append(item)
        else:
            t0 = tt()
            rec._consume(item)
            t["end"] += tt() - t0
    while fan:
        r = fan.popleft()
        for sink in rec.sinks:
            f = sink.observe if type(r) is StepRecord else getattr(sink, "end", None)
            if f is None:
                continue
            t0 = tt()
            f(r)
            t[f"sink:{sink.name}"] += tt() - t0
        if view is not None and type(r) is StepRecord:
            t0 = tt()
            view.observe(r)
            t["metrics view (--enable-metrics)"] += tt() - t0
    return records, t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    gens: Counter = Counter()
    gc.callbacks.append(lambda phase, info: gens.update([info["generation"]]) if phase == "start" else None)
    sess = d.session()
    sess.instrument()
    try:
        rec = queue_steps(sess, a.batch, a.steps)
        gens.clear()
        records, t = parts(rec, metrics_view(rec))
        g = dict(gens)
        print(f"batch {a.batch}: {records} records; drain CPU us per record by part:")
        for k, v in sorted(t.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<24} {v / records / 1e3:8.1f}")
        print(f"  {'total':<24} {sum(t.values()) / records / 1e3:8.1f}")
        print(f"gc collections per 1000 records by generation: "
              + ", ".join(f"gen{k}: {v * 1000 / records:.1f}" for k, v in sorted(g.items())))
        rec2 = queue_steps(sess, a.batch, a.steps)
        prof = cProfile.Profile()
        prof.enable()
        parts(rec2)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    finally:
        sess.uninstrument()
    return 0


if __name__ == "__main__":
    sys.exit(main())
