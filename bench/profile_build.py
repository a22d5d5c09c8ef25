#!/usr/bin/env python3
"""Building ``/ctx_profile`` after 10^4 decode steps: numpy Theil-Sen against the Python loop, side by side.

An aggregator takes 10^4 EAGLE decode records (batch 1..8, contexts 100..30k tokens over the pow2
buckets, every phase with noise), as a server's scheduler would after a long run; then
``build_profile(snapshot)`` (the ``GET /ctx_profile`` body: up to 9 robust Theil-Sen fits of 32,640
pairs each, plus the rest) is timed alternately with the pairwise slopes from numpy (now) and from
the pure-Python loop (before), ``--reps`` times each.  Prints both medians and their ratio, and checks
the two profiles are equal.  Then one served ``/ctx_profile`` body, changed against unchanged
(``http_build``'s cache), and a read loop with 3 new steps between reads: every fit refitted against
fits remembered by their points (the build cache's ``stats.FitMemo``), alternately.  Last, the JSON reply from kept
body texts (``http_body``) against ``json_response(profile.to_dict())``, changed and cached.

A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ctxprof.aggregate.aggregator import Aggregator  # noqa: E402
from sglang_ctxprof.model import stats  # noqa: E402
from sglang_ctxprof.model.records import RankId, StepRecord  # noqa: E402
from sglang_ctxprof.views.profile import build_profile  # noqa: E402


def fill(n: int) -> Aggregator:
    rng = random.Random(3)
    agg = Aggregator()
    for s in range(n):
        bs = rng.randint(1, 8)
        ctx = tuple(rng.randint(100, 30000) for _ in range(bs))
        k = sum(ctx) / 1000
        attn, moe, draft, de = 0.02 * k + rng.random() * 0.1, 0.8 + rng.random() * 0.1, 0.5, 0.3
        rest, over = 0.4 + rng.random() * 0.05, 0.2
        ph = {"draft": draft, "verify": attn + moe + rest, "verify_attn": attn, "verify_moe": moe,
              "verify_rest": rest, "draft_extend": de, "overhead": over}
        agg.observe(StepRecord(step_id=s, kind="decode", algorithm="EAGLE", rank=RankId(),
                               rids=tuple(f"r{(s // 50) * 8 + j}" for j in range(bs)), ctx_lens=ctx,
                               accepted=(3,) * bs, committed=(3,) * bs, finished=(False,) * bs, draft_tokens=4,
                               step_ms=draft + attn + moe + rest + de + over, phases_ms=ph,
                               t_start_ns=s * 10_000_000, timing="cpu"))
    return agg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=7)
    ns = ap.parse_args(argv)
    agg = fill(ns.steps)
    snap = agg.snapshot(with_requests=False)
    fast = stats._median_slope  # build_profile without a fit memo: every build fits

    def slow(pts, eps):
        s = stats._pair_slopes_py(pts, eps)
        return stats._median(s) if s else None

    t = {"numpy": [], "python": []}
    bodies = {}
    for r in range(ns.reps):
        for name, fn in (("numpy", fast), ("python", slow)) if r % 2 == 0 else (("python", slow), ("numpy", fast)):
            stats._median_slope = fn
            t0 = time.perf_counter()
            bodies[name] = build_profile(snap).to_dict()
            t[name].append((time.perf_counter() - t0) * 1e3)
    stats._median_slope = fast
    fits = sum(1 for p in snap.fit_points.values() if len(p.points) >= 2)
    a, b = statistics.median(t["python"]), statistics.median(t["numpy"])
    print(f"{ns.steps} steps, {fits} robust fits of up to 256 points: build_profile "
          f"python {a:.1f} ms, numpy {b:.1f} ms, ratio {a / b:.1f}x; equal: {bodies['numpy'] == bodies['python']}")
    served(agg, ns.reps)
    return 0


def served(agg: Aggregator, reps: int) -> None:
    """What one ``GET /ctx_profile`` of a one-rank server builds in the HTTP process: a changed
    state (a miss: one build) against an unchanged one (served from ``http_build``'s cache)."""
    from sglang_ctxprof.views import http, http_build

    payload = {"state": agg.state(with_requests=False), "status": {"enabled": True, "pid": 1, "submitted": agg.records}}
    miss, hit = [], []
    for r in range(reps):
        http_build.CACHE.clear()
        http_build.CACHE.fits.clear()  # a changed state whose every fit changed too
        t0 = time.perf_counter()
        http.served_profile([payload]).to_dict()
        t1 = time.perf_counter()
        http.served_profile([payload]).to_dict()
        miss.append((t1 - t0) * 1e3)
        hit.append((time.perf_counter() - t1) * 1e3)
    print(f"served /ctx_profile body (one rank): changed state {statistics.median(miss):.1f} ms, "
          f"unchanged (cached) {statistics.median(hit):.2f} ms")
    loop(agg, reps)


def loop(agg: Aggregator, reps: int) -> None:
    """A read loop: 3 new steps between reads (a read every ~100 ms at ~30 ms a step), so every read
    builds; with the Theil-Sen fits remembered by their points in the build cache's memo
    (``http_build.CACHE.fits``, now) and with a memo that keeps none (before)."""
    from sglang_ctxprof.views import http, http_build

    rng = random.Random(9)
    t = {"remembered": [], "refit": []}
    memo, none = http_build.CACHE.fits, stats.FitMemo(kept=0)
    base = agg.records
    for r in range(reps * 2):
        name = ("remembered", "refit")[r % 2]
        http_build.CACHE.fits = memo if name == "remembered" else none
        for k in range(3):
            bs = rng.randint(1, 8)
            agg.observe(StepRecord(step_id=base + r * 3 + k, kind="decode", algorithm="EAGLE", rank=RankId(),
                                   rids=tuple(f"z{j}" for j in range(bs)),
                                   ctx_lens=tuple(rng.randint(100, 30000) for _ in range(bs)),
                                   accepted=(3,) * bs, committed=(3,) * bs, finished=(False,) * bs, draft_tokens=4,
                                   step_ms=3.0, phases_ms={"draft": 0.5, "verify": 1.5, "verify_attn": 0.5,
                                                           "verify_moe": 0.8, "verify_rest": 0.2,
                                                           "draft_extend": 0.3, "overhead": 0.2},
                                   t_start_ns=(base + r * 3 + k) * 10_000_000, timing="cpu"))
        payload = {"state": agg.state(with_requests=False),
                   "status": {"enabled": True, "pid": 1, "submitted": agg.records}}
        http_build.CACHE.clear()
        t0 = time.perf_counter()
        http.served_profile([payload]).to_dict()
        t[name].append((time.perf_counter() - t0) * 1e3)
    http_build.CACHE.fits = memo
    a, b = statistics.median(t["refit"]), statistics.median(t["remembered"])
    print(f"read loop (3 new steps a read): refit every fit {a:.1f} ms, fits remembered {b:.1f} ms, ratio {a / b:.1f}x")
    json_reply(agg, reps)


def json_reply(agg: Aggregator, reps: int) -> None:
    """The JSON reply of ``GET /ctx_profile`` (one rank), built and serialized: from kept body texts
    (``http_body``, now) against ``json_response(profile.to_dict())`` (before), for a changed state
    (a build) and an unchanged one (cached), alternately; the bytes must be equal."""
    from sglang_ctxprof.views import http, http_build
    from sglang_ctxprof.views.http_guard import json_response

    payload = {"state": agg.state(with_requests=False),
               "status": {"enabled": True, "pid": 1, "submitted": agg.records, "dropped": 0}}
    ways = {"texts": lambda: http._profile_reply([payload], "json").body,
            "to_dict": lambda: json_response(http.served_profile([payload]).to_dict()).body}
    t: dict = {(w, c): [] for w in ways for c in ("changed", "cached")}
    bodies = {}
    for r in range(reps * 2):
        for w in (("texts", "to_dict") if r % 2 == 0 else ("to_dict", "texts")):
            http_build.CACHE.clear()
            t0 = time.perf_counter()
            bodies[w] = ways[w]()
            t1 = time.perf_counter()
            ways[w]()
            t[(w, "changed")].append((t1 - t0) * 1e3)
            t[(w, "cached")].append((time.perf_counter() - t1) * 1e3)
    for c in ("changed", "cached"):
        a, b = statistics.median(t[("to_dict", c)]), statistics.median(t[("texts", c)])
        print(f"/ctx_profile JSON reply, {c}: to_dict + dumps {a:.2f} ms, kept texts {b:.2f} ms, ratio {a / b:.1f}x")
    print(f"  bytes equal: {bodies['texts'] == bodies['to_dict']} ({len(bodies['texts']) / 1e3:.0f} kB)")


if __name__ == "__main__":
    raise SystemExit(main())
