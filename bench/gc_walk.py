#!/usr/bin/env python3
"""What the profiler's kept objects cost each garbage collection, at SGLang's pace of collections.

The profiler runs as in ``bench/drain_gil.py`` (the real session, recorder, aggregator and default
sinks, hooked into a fake scheduler whose requests live ``--life`` steps) at each ``--batches`` size:
after its first steps the heap is frozen (the start-up heap, as SGLang's ``freeze_gc`` does), then
``--warm`` steps bring the profiler's state to its steady size, and automatic collection is off.  Per trial: ``--every`` steps (8: the real
CPU server's young collections come every ~8-10 decode steps, ``bench/gc_cadence.py``), the drain
flushed, then one young collection, timed; every 10th trial a generation-1 collection, and every
30th a full one (of what is not frozen: the profiler's state).  Printed per batch: the median and
longest young collection, the median generation-1 one, each full one (ms), and the references a
full collection follows (each unfrozen tracked object's referents, counted).  Run its copy in
another checkout to compare trees (``drain_loop`` puts its own checkout first on the path);
CPU-bound and short, but still timings: compare side by side.

A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import drain_loop as d  # noqa: E402  (puts the checkout that holds it first on sys.path)
import torch  # noqa: E402


def walk() -> int:
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def measure(n: int, a: argparse.Namespace) -> dict:
    fwd = d._Forward()
    sess = d.session()
    sess.instrument()
    try:
        sched, batch = d.Sched(d.FakeWorker(fwd.run)), d.Batch(n, a.life)
        rec = sess.profiler.recorder

        def step() -> None:
            batch.refill()
            sched.process_batch_result(batch, sched.run_batch(batch))

        for _ in range(5):  # every import and first-use object of the run, then frozen (the start-up heap)
            step()
        rec.flush()
        gc.collect()
        gc.freeze()
        for _ in range(a.warm):  # the profiler's state at its steady size: what collections walk
            step()
        rec.flush()
        gc.collect()
        gc.disable()
        young, gen1, full, refs = [], [], [], 0
        try:
            for trial in range(a.trials):
                for _ in range(a.every):
                    step()
                rec.flush()
                t0 = time.perf_counter()
                gc.collect(0)
                young.append(time.perf_counter() - t0)
                if trial % 10 == 9:
                    t0 = time.perf_counter()
                    gc.collect(1)
                    gen1.append(time.perf_counter() - t0)
                if trial % 30 == 29:
                    t0 = time.perf_counter()
                    gc.collect(2)
                    full.append(time.perf_counter() - t0)
            refs = walk()
        finally:
            gc.enable()
            gc.unfreeze()
    finally:
        sess.uninstrument()
    return {"batch": n, "young_us_p50": statistics.median(young) * 1e6, "young_us_max": max(young) * 1e6,
            "gen1_us_p50": statistics.median(gen1) * 1e6 if gen1 else None, "full_ms": [t * 1e3 for t in full],
            "full_walk_refs": refs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--life", type=int, default=128)
    ap.add_argument("--warm", type=int, default=600, help="steps before the heap is frozen")
    ap.add_argument("--every", type=int, default=8, help="steps between two young collections")
    ap.add_argument("--trials", type=int, default=60)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    d._Forward.ops, d._Forward.size = 2, 16  # the forward is not what is measured
    import sglang_ctxprof

    print(f"sglang_ctxprof from {Path(sglang_ctxprof.__file__).parent}; a young collection every {a.every} steps")
    for n in a.batches:
        r = measure(n, a)
        print(f"batch {n:>3}: young p50 {r['young_us_p50']:6.0f} us, max {r['young_us_max']:6.0f} | gen1 p50 "
              f"{r['gen1_us_p50'] or 0:6.0f} us | full {', '.join(f'{t:.2f}' for t in r['full_ms'])} ms | "
              f"full walk {r['full_walk_refs']} refs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
