#!/usr/bin/env python3
"""What the drain thread's work per record costs once the CPU's caches have forgotten it.

In a server the drain thread takes a record after the scheduler has run a whole step, whose
forward and bookkeeping pass through the caches in between; ``bench/drain_profile.py`` drains
records back to back, its working set warm.  This drains the same queued records (the real
profiler session and default sinks of ``drain_loop``, a batch of ``--batch`` requests, the drain
thread held) one piece at a time as the drain thread does (each stage of the record's build, each
aggregator stage, each sink's turn), in three arms, each in turn ``--rounds`` times:

* **warm**: back to back, as ``drain_profile.py``;
* **record**: ``--evict-mb`` MB of memory written before each record (more than the last-level
  cache: what a step of the scheduler leaves; 4 MB evicts the per-core caches only);
* **piece**: the same before every piece (what a scheduler thread running between two slices
  would leave, at most: the paced drain's hand-overs).

Printed (the sinks' own log lines go to stderr): CPU µs per record by piece and in all (``time.thread_time_ns``; the eviction itself is
outside the timed spans), the median over the rounds.  A benchmark, not a test: it asserts
nothing about timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

import drain_loop as d  # noqa: E402
from drain_profile import queue_steps  # noqa: E402
from sglang_ctxprof.model.records import StepRecord  # noqa: E402

ARMS = ("warm", "record", "piece")
_END = object()


def drain(arm: str, batch: int, steps: int, evict_mb: int) -> tuple[int, Counter]:
    """Queue ``steps`` steps, then drain them piece by piece: (records, CPU ns per piece name)."""
    buf = np.zeros(evict_mb * 2**20 // 8)
    evict = buf.__iadd__  # writes every cache line of the buffer
    t, tt = Counter(), time.thread_time_ns
    sess = d.session()
    sess.instrument()
    try:
        rec = queue_steps(sess, batch, steps)
        agg, q, n = rec.aggregator, rec._q, 0

        def piece(name: str, fn, *args):
            if arm == "piece":
                evict(1.0)
            t0 = tt()
            out = fn(*args)
            t[name] += tt() - t0
            return out

        while q:
            if arm == "record":
                evict(1.0)
            item, k = q.popleft(), 0
            while item is not None and type(item) is not StepRecord:
                item = piece(f"build {k}", item.build)
                k += 1
            if item is None:
                continue
            n += 1
            stages, k = agg.stages(item), 0
            while piece(f"aggregate {min(k, 5)}", next, stages, _END) is not _END:  # its last stage ends it
                k += 1  # the request history's further chunks and its pruning: one row, "aggregate 5+"
            for sink in rec.sinks:
                piece(f"sink {sink.name}", sink.observe, item)
        return n, t
    finally:
        sess.uninstrument()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--evict-mb", type=int, default=64)
    a = ap.parse_args(argv)
    per: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for _ in range(a.rounds):
        for arm in ARMS:
            n, t = drain(arm, a.batch, a.steps, a.evict_mb)
            per[arm].append({k: v / n / 1e3 for k, v in t.items()})
    names = sorted({k for rows in per.values() for r in rows for k in r})
    print(f"batch {a.batch}: {a.steps} records per round, {a.rounds} rounds; {a.evict_mb} MB written before each "
          f"record ('record') or piece ('piece'); CPU µs per record, median over the rounds")
    print(f"{'piece':>22} " + " ".join(f"{arm:>8}" for arm in ARMS))
    for name in names + ["total"]:
        vals = [statistics.median(sum(r.values()) if name == "total" else r.get(name, 0.0) for r in per[arm])
                for arm in ARMS]
        label = "aggregate 5+" if name == "aggregate 5" else name
        print(f"{label:>22} " + " ".join(f"{v:8.1f}" for v in vals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
