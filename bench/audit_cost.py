#!/usr/bin/env python3
"""What the live self-audit costs the drain thread, per record, side by side in one run.

Records shaped like the CPU server's (EAGLE, a MoE model's verify split, every request at ~2k
context, one request in 64 finishing at each step with the engine's books) are fed to two
aggregators that differ only in the audit (``Aggregator(audit=...)``): **off** and **on**,
alternating chunk by chunk, at batch 1, 32 and 256.  Per batch size it prints the median chunk
time per record of each and their ratio (on / off); then, on a third aggregator, each record's
aggregation and its audit timed apart, record by record: the audit's µs per record and its ratio to
the median record with the audit off (audit/off: on a busy machine a steadier figure than on/off).  Requests are retired as they finish and replaced by
new ones, so the request history stays at its steady-state size.

A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ctxprof.aggregate.aggregator import Aggregator  # noqa: E402
from sglang_ctxprof.aggregate.audit import Audit  # noqa: E402
from sglang_ctxprof.model.records import RankId, StepRecord  # noqa: E402

PH = {"draft": 1.1, "verify": 3.2, "verify_attn": 1.4, "verify_moe": 1.1, "verify_rest": 0.7,
      "draft_extend": 0.6, "overhead": 0.4}


def records(batch: int, n: int) -> list[StepRecord]:
    """``n`` decode steps of ``batch`` requests; each request runs 64 steps, then finishes and is
    replaced.  A new request's prefill comes before its first step (a prefill record of the step's new
    requests), so the ones that finish are held whole and checked against their books."""
    out, life = [], 64
    for s in range(n):
        new = [f"b{batch}-r{j}-{(s + j) // life}" for j in range(batch) if (s + j) % life == 0]
        if new:
            k = len(new)
            out.append(StepRecord(step_id=s, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=tuple(new),
                                  ctx_lens=(2000,) * k, accepted=(0,) * k, committed=(0,) * k,
                                  finished=(False,) * k, draft_tokens=0, step_ms=20.0, t_start_ns=s * 7_000_000))
        rids, fin, books = [], [], []
        for j in range(batch):
            age = (s + j) % life
            gen = (s + j) // life
            rids.append(f"b{batch}-r{j}-{gen}")
            done = age == life - 1
            fin.append(done)
            seen = min(life, s + 1)  # the first requests were already running at step 0
            books.append((seen, 1 + 3 * seen, 2 * seen) if done else (-1, -1, -1))
        out.append(StepRecord(step_id=s, kind="decode", algorithm="EAGLE", rank=RankId(), rids=tuple(rids),
                              ctx_lens=tuple(2000 + (s % 64) * 3 for _ in range(batch)), accepted=(3,) * batch,
                              committed=(3,) * batch, finished=tuple(fin), draft_tokens=4, step_ms=5.3,
                              phases_ms=PH, t_start_ns=s * 7_000_000, timing="cpu",
                              books=tuple(books) if any(fin) else ()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=32, help="chunks per aggregator and batch size")
    ns = ap.parse_args(argv)
    print(f"{'batch':>6} {'off us/rec':>11} {'on us/rec':>10} {'on/off':>7} {'audit us/rec':>13} {'audit/off':>10}")
    for batch in (1, 32, 256):
        chunk = max(8, 4096 // batch)  # chunks of ~4k request-steps
        n = chunk * ns.chunks
        recs = records(batch, n)
        n = len(recs)  # with the prefills
        aggs = {"off": Aggregator(audit=False), "on": Aggregator(audit=True)}
        times: dict[str, list[float]] = {"off": [], "on": []}
        for c in range(0, n, chunk):
            part = recs[c:c + chunk]
            for mode in (("off", "on") if (c // chunk) % 2 == 0 else ("on", "off")):
                obs = aggs[mode].observe
                t0 = time.perf_counter()
                for r in part:
                    obs(r)
                times[mode].append((time.perf_counter() - t0) / len(part) * 1e6)
        # the audit in context: a third aggregator whose audit is called, and timed, right after it
        third = Aggregator(audit=True)
        audit, third.audit = third.audit, None
        pc, t_audit = time.perf_counter_ns, 0
        for r in recs:
            third.observe(r)
            t1 = pc()
            audit.observe(r, third.requests)
            t_audit += pc() - t1
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        a = t_audit / n / 1e3
        print(f"{batch:>6} {off:>11.1f} {on:>10.1f} {on / off:>7.3f} {a:>13.2f} {a / off:>10.3f}")
        st = aggs["on"].audit.status()
        assert st["violations"] == dict.fromkeys(st["violations"], 0) and st["checked"]["requests"] > 0, st
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
