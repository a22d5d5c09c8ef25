#!/usr/bin/env python3
"""What a drain in another process would cost the scheduler thread, next to the drain thread's work.

The drain thread shares the GIL with SGLang's scheduler thread, so its CPU per record turns into
scheduler delay (``bench/drain_gil.py``: the p50 delay follows the drain's CPU per step as the batch
grows).  A drain in a process of its own would share no GIL; the scheduler thread would pay only
to hand each step's facts over.  This measures both sides on the same steps, at each batch size:

* **thread**: the drain thread's CPU per record as it runs now (the record build, the aggregator,
  the default sinks and a live metrics view: ``bench/drain_profile.parts``), uncontended;
* **process**: the scheduler thread's CPU per step to hand the same step over to a child process:
  the request ids and prompt lengths from the id cache (``host.IdCache``, which would then live on
  the scheduler thread), the CPU-clock step arithmetic (``step.resolve``), the step's plain facts
  pickled and written to a pipe that a child process reads and unpickles.

The steps are the real ones of ``bench/drain_loop.py``'s fake scheduler hooked by the real profiler
session (``drain_profile.queue_steps``).  Printed per batch: both CPU µs per step and their ratio.
A benchmark, not a test; it builds no such process drain, it prices one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import drain_profile as dp  # noqa: E402
from sglang_ctxprof.collect.clocks import CpuClock  # noqa: E402
from sglang_ctxprof.collect.host import HostFacts, IdCache  # noqa: E402
from sglang_ctxprof.collect.step import resolve  # noqa: E402


def _child(conn) -> None:
    while True:
        b = conn.recv_bytes()
        if not b:
            return
        pickle.loads(b)


def wire(f: HostFacts, ids: IdCache) -> bytes:
    """The step's facts as a drain process would need them (plain builtins), pickled."""
    step_ms, phases = f.step_ms, f.phases_ms
    if f.builder is not None:
        res = resolve(f.builder, CpuClock, f.full_phases)
        if res is not None:
            step_ms, phases = res
    rids, plens = ids.get(f.reqs)
    return pickle.dumps((f.step_id, f.kind, f.algorithm, rids, plens, f.lens_pre, f.vct_pre, f.emitted,
                         f.vct_post, f.fin, f.accepts, f.draft_tokens, step_ms, phases, f.t_start_ns,
                         f.t_end_ns), protocol=pickle.HIGHEST_PROTOCOL)


def measure(sess, batch: int, steps: int, conn) -> tuple[float, float]:
    rec = dp.queue_steps(sess, batch, steps)
    facts = [x for x in rec._q if isinstance(x, HostFacts)]
    ids, tt = IdCache(), time.thread_time_ns
    t0 = tt()
    for f in facts:  # the scheduler thread's side of a process drain (before the thread drain builds them)
        conn.send_bytes(wire(f, ids))
    hand = (tt() - t0) / len(facts) / 1e3
    for f in facts:  # as the scheduler hands them over: the builders are resolved, the id cache filled
        f.builder = None
    records, parts = dp.parts(rec, dp.metrics_view(rec))
    return sum(parts.values()) / max(records, 1) / 1e3, hand


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args(argv)
    parent, child_end = mp.Pipe()
    child = mp.get_context("spawn").Process(target=_child, args=(child_end,), daemon=True)
    child.start()
    sess = dp.d.session()
    sess.instrument()
    try:
        print(f"{'batch':>5} | {'thread drain CPU us/record':>27} | {'process hand-off us/step':>25} | ratio")
        for b in (int(x) for x in a.batches.split(",")):
            thread_us, hand_us = measure(sess, b, a.steps, parent)
            print(f"{b:>5} | {thread_us:>27.1f} | {hand_us:>25.1f} | {thread_us / hand_us:5.1f}x")
    finally:
        sess.uninstrument()
        parent.send_bytes(b"")
        child.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
