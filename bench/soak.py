"""Soak test of the data path: 10^6 synthetic step records through the real Recorder + Aggregator.

A simulated scheduler keeps up to ``--max-batch`` requests running; requests arrive with mixed
prompt lengths (log-uniform 64..``--max-ctx``) and output lengths (16..512), each decode step
accepts 1..draft tokens per request and grows its context; joins produce prefill records.  Every
record goes through ``Recorder.submit`` (the hot-path hand-off, drained by the real daemon thread)
into the real ``Aggregator`` with the default bounds.

At 10^4, 10^5 and 10^6 records it prints the process RSS (and its growth since start-up) and the
latency of what ``GET /ctx_profile`` costs on the profiler side: the control handler's snapshot
(flush + ``Aggregator.state(with_requests=False)``), a JSON round trip standing in for the control
channel, and the HTTP side's ``merge_states`` + ``summarize``; and the same for
``GET /ctx_profile/requests?slowest=10``.
Goals: RSS growth flat and < 64 MB; snapshot p99 < 50 ms at 10^6.

    python bench/soak.py [--records 1000000] [--snapshots 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sglang_ctxprof.aggregate.aggregator import Aggregator, merge_states  # noqa: E402
from sglang_ctxprof.views.profile import summarize  # noqa: E402
from sglang_ctxprof.model.names import KIND_DECODE, KIND_PREFILL  # noqa: E402
from sglang_ctxprof.model.records import RankId, StepRecord  # noqa: E402
from sglang_ctxprof.collect.recorder import Recorder  # noqa: E402
from sglang_ctxprof.model.guard import Guard  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Workload:
    """A deterministic stream of realistic step records (speculative decode with EAGLE, 4 drafts)."""

    def __init__(self, seed: int, max_batch: int, max_ctx: int, draft: int = 4) -> None:
        self.rng = random.Random(seed)
        self.max_batch = max_batch
        self.max_ctx = max_ctx
        self.draft = draft
        self.active: list[list] = []  # [rid, ctx, remaining]
        self.next_rid = 0
        self.step = 0
        self.rank = RankId()

    def _new_request(self) -> list:
        r = self.rng
        ctx = int(math.exp(r.uniform(math.log(64), math.log(self.max_ctx))))
        self.next_rid += 1
        return [f"{self.next_rid:032x}", ctx, r.randint(16, 512)]

    def next(self) -> StepRecord:
        r = self.rng
        self.step += 1
        want = r.randint(max(1, self.max_batch // 2), self.max_batch)
        if len(self.active) < want and r.random() < 0.3:
            joined = [self._new_request() for _ in range(min(4, want - len(self.active)))]
            self.active.extend(joined)
            ms = 0.02 * sum(q[1] for q in joined) / 64 + r.uniform(1, 3)
            return StepRecord(self.step, KIND_PREFILL, "EAGLE", self.rank, tuple(q[0] for q in joined),
                              tuple(q[1] for q in joined), (0,) * len(joined), (0,) * len(joined),
                              (False,) * len(joined), 0, ms, {}, time.time_ns(), "cpu")
        if not self.active:
            self.active.append(self._new_request())
        rids, ctx, acc, com, fin = [], [], [], [], []
        for q in self.active:
            a = r.randint(1, self.draft)
            c = min(a, q[2])
            rids.append(q[0]); ctx.append(q[1]); acc.append(a); com.append(c)
            q[1] += c
            q[2] -= c
            fin.append(q[2] <= 0)
        self.active = [q for q in self.active if q[2] > 0]
        kctx = sum(ctx) / 1000
        d, va, vm = 1.0 + r.random(), 0.3 + 0.05 * kctx, 0.8 + r.random() * 0.2
        vr, de, ov = 0.5 + r.random() * 0.1, 0.4 + r.random() * 0.1, 0.2 + r.random() * 0.1
        phases = {"draft": d, "verify": va + vm + vr, "verify_attn": va, "verify_moe": vm,
                  "verify_rest": vr, "draft_extend": de, "overhead": ov}
        step = d + va + vm + vr + de + ov
        return StepRecord(self.step, KIND_DECODE, "EAGLE", self.rank, tuple(rids), tuple(ctx),
                          tuple(acc), tuple(com), tuple(fin), self.draft, step, phases,
                          time.time_ns(), "cpu")


def snapshot(recorder: Recorder) -> dict:
    """What one GET /ctx_profile costs on our side (the scheduler's state + the HTTP summary)."""
    st = recorder.with_aggregator(lambda a: a.state(with_request_steps=False, with_requests=False))
    wire = json.loads(json.dumps(st))  # the state crosses a process boundary as builtins
    return summarize(merge_states([wire]))


def slowest(recorder: Recorder) -> list:
    """What GET /ctx_profile/requests?slowest=10 costs on the scheduler side."""
    return json.loads(json.dumps(recorder.with_aggregator(lambda a: a.requests.slowest(10, with_steps=True))))


def _pct(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


def measure(recorder: Recorder, n: int) -> dict[str, float]:
    snap, req = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        snapshot(recorder)
        t1 = time.perf_counter()
        slowest(recorder)
        snap.append((t1 - t0) * 1e3)
        req.append((time.perf_counter() - t1) * 1e3)
    p50, p99 = _pct(snap)
    r50, r99 = _pct(req)
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": max(snap), "requests_p50_ms": r50, "requests_p99_ms": r99}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--snapshots", type=int, default=30, help="snapshots timed at each checkpoint")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-ctx", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
    ns = ap.parse_args(argv)
    if ns.records < 1 or ns.snapshots < 1 or ns.max_batch < 1 or ns.max_ctx < 64:
        ap.error("--records, --snapshots and --max-batch must be >= 1 and --max-ctx >= 64")

    gc.collect()
    base = rss_mb()
    agg = Aggregator()  # the defaults the server uses
    rec = Recorder(agg, Guard(), maxsize=65536)
    rec.start()
    wl = Workload(ns.seed, ns.max_batch, ns.max_ctx)
    checkpoints = [c for c in (10_000, 100_000, 1_000_000) if c <= ns.records] or [ns.records]
    if ns.records not in checkpoints:
        checkpoints.append(ns.records)
    results = []
    print(f"{'records':>9} {'req-steps':>10} {'RSS MB':>8} {'growth MB':>9} {'snap p50 ms':>11} "
          f"{'snap p99 ms':>11} {'max ms':>8} {'reqs p99':>8} {'rows':>6} {'dropped':>7} {'feed s':>7}",
          flush=True)
    done, req_steps, t_feed = 0, 0, 0.0
    for cp in checkpoints:
        t0 = time.perf_counter()
        while done < cp:
            r = wl.next()
            req_steps += len(r.rids)
            rec.submit(r)
            done += 1
            if done % 4096 == 0:
                while len(rec._q) > 2048:  # keep the producer at the drain's pace (no drops)
                    time.sleep(0.002)
        rec.flush()
        t_feed += time.perf_counter() - t0
        gc.collect()
        m = measure(rec, ns.snapshots)
        row = {"records": cp, "request_steps": req_steps, "rss_mb": rss_mb(), "rss_growth_mb": rss_mb() - base,
               "dropped": rec.dropped, "feed_s": t_feed, **m}
        results.append(row)
        print(f"{cp:>9} {req_steps:>10} {row['rss_mb']:>8.1f} {row['rss_growth_mb']:>9.1f} {m['p50_ms']:>11.2f} "
              f"{m['p99_ms']:>11.2f} {m['max_ms']:>8.2f} {m['requests_p99_ms']:>8.2f} {agg.requests.rows:>6} "
              f"{rec.dropped:>7} {t_feed:>7.1f}", flush=True)
    rec.stop()
    last = results[-1]
    ok_mem = last["rss_growth_mb"] < 64
    ok_lat = last["p99_ms"] < 50
    print(f"goals: memory growth < 64 MB: {'met' if ok_mem else 'NOT met'}; "
          f"snapshot p99 < 50 ms: {'met' if ok_lat else 'NOT met'}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"results": results, "memory_goal_met": ok_mem, "latency_goal_met": ok_lat}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
