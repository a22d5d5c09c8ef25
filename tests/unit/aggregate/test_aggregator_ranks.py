"""Merging per-rank snapshots (aggregator.merge_states, views.http.served_profile).

Each rank's snapshot is a real ``Aggregator`` state, sent through JSON as it travels over SGLang's
control channel.  The merged view must equal what a single aggregator that saw every rank's steps
reports (counts and histograms exactly, float sums to rounding), and served_profile must keep the
per-rank views, their errors and flags.  The live multi-rank server check is
tests/server/test_multirank.py (--dp-size 2 and --tp-size 2 on this CPU).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ctxprof.aggregate.aggregator import Aggregator, merge_states
from sglang_ctxprof.views.profile import summarize
from sglang_ctxprof.views.http import served_profile
from sglang_ctxprof.model.records import RankId, StepRecord

LEAVES = ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead")


def served(payloads):
    return served_profile(payloads).to_dict()


def _record(rank: RankId, i: int, ctx: list[int], acc: list[int], times: list[float], alg="EAGLE") -> StepRecord:
    ph = dict(zip(LEAVES, times))
    ph["verify"] = ph["verify_attn"] + ph["verify_moe"] + ph["verify_rest"]
    n = len(ctx)
    return StepRecord(step_id=i, kind="decode", algorithm=alg, rank=rank,
                      rids=tuple(f"r{rank.dp}-{i}-{j}" for j in range(n)), ctx_lens=tuple(ctx),
                      accepted=tuple(acc), committed=tuple(acc), finished=(False,) * n, draft_tokens=4,
                      step_ms=sum(times), phases_ms=ph)


step = st.tuples(
    st.lists(st.integers(1, 9000), min_size=1, max_size=4),
    st.lists(st.floats(0.01, 50.0, allow_nan=False), min_size=len(LEAVES), max_size=len(LEAVES)),
    st.integers(1, 4),
)


def _snapshot(agg: Aggregator, rank: RankId, enabled=True, dropped=0) -> dict:
    payload = {"status": {"enabled": enabled, "rank": rank.to_dict(), "dropped": dropped, "degraded": None},
               "state": agg.state()}
    return json.loads(json.dumps(payload))  # the wire: builtins only, str keys


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)
    else:
        assert a == b


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(step, max_size=30), min_size=1, max_size=4))
def test_merged_equals_single_aggregator(per_rank):
    single = Aggregator()
    snaps = []
    for dp, steps in enumerate(per_rank):
        agg = Aggregator()
        rank = RankId(0, dp, 0)
        for i, (ctx, times, a) in enumerate(steps):
            rec = _record(rank, i, ctx, [a] * len(ctx), times)
            agg.observe(rec)
            single.observe(rec)
        snaps.append(_snapshot(agg, rank))
    merged = summarize(merge_states([s["state"] for s in snaps]))
    want = summarize(json.loads(json.dumps(single.state())))
    merged.pop("hw", None), want.pop("hw", None)
    for body in (merged, want):  # an outlier's ordinals are its own rank's (each rank warms up on its own)
        for b in body["buckets"]:
            if b.get("robust"):
                b["robust"]["outliers"] = sorted(o["step_ms"] for o in b["robust"]["outliers"])
    _close(merged, want)
    body = served(snaps)
    assert [r["status"]["rank"]["dp"] for r in body["ranks"]] == list(range(len(per_rank)))
    assert body["totals"]["decode_steps"] == sum(len(s) for s in per_rank)
    assert body["enabled"] is True


def test_build_profile_keeps_rank_errors_and_flags():
    a, b = Aggregator(), Aggregator()
    for i in range(5):
        a.observe(_record(RankId(0, 0, 0), i, [100], [3], [1.0] * 6))
        b.observe(_record(RankId(0, 1, 0), i, [3000], [2], [2.0] * 6, alg="NGRAM"))
    snaps = [_snapshot(a, RankId(0, 0, 0), dropped=2), _snapshot(b, RankId(0, 1, 0), enabled=False, dropped=1),
             {"error": "ctx profiler not active in this scheduler"}]
    body = served(snaps)
    assert body["ranks"][2] == {"error": "ctx profiler not active in this scheduler"}
    assert [r["profile"]["totals"]["decode_steps"] for r in body["ranks"][:2]] == [5, 5]
    assert body["enabled"] is False  # one rank is disabled
    assert body["dropped"] == 3
    assert body["algorithms"] == ["EAGLE", "NGRAM"]
    assert [x["label"] for x in body["buckets"]] == ["64-127", "2048-4095"]
    assert body["buckets"][1]["phases"]["step"]["mean_ms"] == pytest.approx(12.0)


def test_build_profile_with_no_good_rank():
    body = served([{"error": "x"}, {"error": "y"}])
    assert body["enabled"] is False and body["buckets"] == [] and body["totals"]["decode_steps"] == 0
    assert [r["error"] for r in body["ranks"]] == ["x", "y"]
