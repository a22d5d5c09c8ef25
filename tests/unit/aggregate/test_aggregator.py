"""Aggregator, bucketing, fit and the /ctx_profile JSON schema (pure, no server)."""

from __future__ import annotations

from dataclasses import replace

import json
import math

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator, merge_states
from sglang_ctxprof.views.profile import summarize
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.records import RankId, StepRecord, validate
from sglang_ctxprof.model.stats import DurationStats, LinearFit


def rec(step, ctx, acc=(4,), com=None, step_ms=10.0, phases=None, rids=None, kind="decode", fin=None):
    n = len(ctx)
    rids = rids or tuple(f"r{step}-{i}" for i in range(n))
    return StepRecord(step_id=step, kind=kind, algorithm="EAGLE", rank=RankId(), rids=tuple(rids),
                      ctx_lens=tuple(ctx), accepted=tuple(acc) * (n if len(acc) == 1 else 1),
                      committed=tuple(com or acc) * (n if len(com or acc) == 1 else 1),
                      finished=tuple(fin or (False,) * n), draft_tokens=4, step_ms=step_ms,
                      phases_ms=phases if phases is not None else
                      {"draft": 2.0, "verify": 6.0, "verify_attn": 3.0, "verify_moe": 2.0, "verify_rest": 1.0,
                       "draft_extend": 1.5, "overhead": 0.5})


def test_pow2_buckets():
    b = Bucketing.parse("pow2", max_ctx=8192)
    assert b.edges[:5] == (0, 64, 128, 256, 512)
    assert b.label(b.index(64)) == "64-127"
    assert b.label(b.index(63)) == "0-63"
    assert b.label(b.index(3072)) == "2048-4095"
    assert b.bounds(len(b.edges) - 1)[1] is None  # open-ended last bucket
    assert b.label(b.index(10**9)).endswith("+")


@pytest.mark.parametrize("spec,ctx,label", [("fixed:1000", 2500, "2000-2999"), ("edges:100,1000", 99, "0-99"),
                                            ("edges:100,1000", 5000, "1000+")])
def test_other_bucket_layouts(spec, ctx, label):
    b = Bucketing.parse(spec, max_ctx=10000)
    assert b.label(b.index(ctx)) == label


@pytest.mark.parametrize("spec", ["fixed:0", "fixed:x", "edges:", "edges:a", "linear", "edges:-5"])
def test_bad_bucket_spec_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="bucket spec"):
        Bucketing.parse(spec)


def test_duration_stats_quantiles_within_2pct():
    s = DurationStats()
    vals = [0.1 * i for i in range(1, 10001)]
    for v in vals:
        s.add(v)
    assert s.count == 10000 and s.total == pytest.approx(sum(vals))
    for q in (0.5, 0.9, 0.99):
        exact = vals[int(q * len(vals)) - 1]
        assert s.quantile(q) == pytest.approx(exact, rel=0.02)
    assert len(s.bins) < 600  # bounded, not one entry per value


def test_linear_fit_exact_and_degenerate():
    f = LinearFit()
    for x in range(10):
        f.add(x, 2.5 * x + 7)
    sol = f.solve()
    assert sol["slope"] == pytest.approx(2.5) and sol["intercept"] == pytest.approx(7) and sol["r2"] == pytest.approx(1)
    g = LinearFit()
    g.add(3, 1)
    g.add(3, 2)
    assert g.solve() is None  # x does not vary: no fit rather than a wrong one


def test_observe_buckets_phases_and_fit():
    agg = Aggregator(Bucketing.parse("pow2", 1 << 16))
    for i in range(20):
        ctx = 100 if i % 2 else 3000
        attn = 1.0 + ctx / 1000.0  # 1 ms per 1k ctx
        agg.observe(rec(i, [ctx], step_ms=5 + attn, phases={"draft": 1.0, "verify": 3 + attn, "verify_attn": attn,
                                                              "verify_moe": 2.0, "verify_rest": 1.0, "draft_extend": 1.0,
                                                              "overhead": 0.0}))
    body = summarize(agg.state())
    labels = [b["label"] for b in body["buckets"]]
    assert labels == ["64-127", "2048-4095"]
    lo, hi = body["buckets"]
    assert lo["steps"] == hi["steps"] == 10
    assert hi["phases"]["verify_attn"]["mean_ms"] == pytest.approx(4.0)
    assert lo["accepted_per_step"] == 4 and lo["decode_tok_s"] == pytest.approx(4 / (6.1 / 1000))
    fit = body["fits"]["verify_attn"]
    assert fit["ms_per_1k_ctx"] == pytest.approx(1.0) and fit["intercept_ms"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(1.0)
    assert body["fits"]["verify_moe"]["ms_per_1k_ctx"] == pytest.approx(0.0, abs=1e-9)


def test_prefill_never_mixed_into_decode():
    agg = Aggregator()
    agg.observe(rec(1, [1000], acc=(0,), step_ms=50, phases={}, kind="prefill"))
    agg.observe(rec(2, [1001], step_ms=10))
    body = summarize(agg.state())
    assert body["buckets"][0]["steps"] == 1
    assert body["prefill"][0]["batches"] == 1 and body["prefill"][0]["mean_ms"] == pytest.approx(50)
    assert body["totals"] == {**body["totals"], "decode_steps": 1, "prefill_batches": 1}


def test_batch_mean_context_bucket_and_per_request_accounting():
    agg = Aggregator()
    agg.observe(rec(1, [100, 3000], acc=(3, 4), com=(3, 2), rids=("a", "b"), fin=(False, True)))
    agg.observe(rec(2, [103], acc=(4,), rids=("a",)))
    body = summarize(agg.state())
    assert [b["label"] for b in body["buckets"]] == ["64-127", "1024-2047"]  # mean ctx 1550
    a = agg.requests.get("a")
    assert a["steps"] == 2 and a["accepted"] == 7 and a["committed"] == 7 and [r["ctx_len"] for r in a["step_rows"]] == [100, 103]
    b = agg.requests.get("b")
    assert b["steps"] == 1 and b["accepted"] == 4 and b["committed"] == 2 and b["finished"] is True


def test_merge_ranks_equals_single_aggregator():
    recs = [rec(i, [64 * (i % 50 + 1)], step_ms=5 + i % 7) for i in range(300)]
    one = Aggregator()
    parts = [Aggregator(), Aggregator(), Aggregator()]
    for i, r in enumerate(recs):
        one.observe(r)
        parts[i % 3].observe(r)
    merged = summarize(merge_states([p.state() for p in parts]))
    single = summarize(one.state())
    assert merged["buckets"] == single["buckets"]
    for p in single["fits"]:
        assert merged["fits"][p]["ms_per_1k_ctx"] == pytest.approx(single["fits"][p]["ms_per_1k_ctx"])


def test_state_is_msgpack_safe_and_schema_stable():
    agg = Aggregator()
    for i in range(5):
        agg.observe(rec(i, [200 + i]))
    state = agg.state(with_request_steps=True)

    def keys_are_str(o):
        if isinstance(o, dict):
            return all(isinstance(k, str) and keys_are_str(v) for k, v in o.items())
        if isinstance(o, list):
            return all(keys_are_str(v) for v in o)
        return isinstance(o, (str, int, float, bool)) or o is None

    assert keys_are_str(state)
    body = summarize(json.loads(json.dumps(state)))
    assert set(body) >= {"schema_version", "timing", "phases", "leaf_phases", "bucketing", "buckets", "fits",
                         "prefill", "totals", "algorithms"}
    b = body["buckets"][0]
    assert set(b) >= {"label", "lo", "hi", "steps", "accepted_per_step", "decode_tok_s", "phases"}
    assert set(b["phases"]["step"]) == {"count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "total_ms"}
    assert all(math.isfinite(v) for v in b["phases"]["step"].values())


def test_record_roundtrip_and_validation():
    r = rec(7, [10, 20], acc=(2, 3), rids=("x", "y"))
    assert StepRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    validate(r)
    bad = StepRecord(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "accepted": (1,)})
    with pytest.raises(ValueError, match="accepted"):
        validate(bad)


def test_memory_bounded_request_ring_and_reset():
    agg = Aggregator(request_capacity=10, max_steps_per_request=3)
    for i in range(20):
        agg.observe(rec(i, [100], rids=(f"r{i}",)))
    for i in range(5):
        agg.observe(rec(20 + i, [101 + i], rids=("r19",)))
    assert len(agg.requests) == 10 and agg.requests.evicted == 10
    assert agg.requests.get("r0") is None
    row = agg.requests.get("r19")
    assert row["steps"] == 6 and len(row["step_rows"]) == 3 and row["steps_truncated"] == 3
    agg.reset()
    assert summarize(agg.state())["buckets"] == []


def test_linear_fit_merge_is_order_independent_when_x_barely_varies():
    pts = [(1.0 + 1e-3 * (i % 3), 1.9 + 0.001 * i) for i in range(7)]
    one = LinearFit()
    for x, y in pts:
        one.add(x, y)
    parts = [LinearFit(), LinearFit(), LinearFit()]
    for i, (x, y) in enumerate(pts):
        parts[i % 3].add(x, y)
    ab, ba = LinearFit(), LinearFit()
    for p in parts:
        ab.merge(LinearFit.from_state(p.to_state()))
    for p in reversed(parts):
        ba.merge(p)
    want = one.solve()
    for got in (ab.solve(), ba.solve()):
        assert got["slope"] == pytest.approx(want["slope"], rel=1e-12)
        assert got["r2"] == pytest.approx(want["r2"], rel=1e-12, abs=1e-12)


def test_linear_fit_reads_a_raw_sum_state():
    f = LinearFit()
    for x, y in [(0.1, 1.0), (1.0, 2.0), (3.0, 4.5)]:
        f.add(x, y)
    sx, sy = 4.1, 7.5
    old = {"n": 3, "sx": sx, "sy": sy, "sxx": 0.01 + 1 + 9, "sxy": 0.1 + 2 + 13.5, "syy": 1 + 4 + 20.25}
    got = LinearFit.from_state(old).solve()
    assert got["slope"] == pytest.approx(f.solve()["slope"], rel=1e-9)
    assert got["intercept"] == pytest.approx(f.solve()["intercept"], rel=1e-9)


def test_acceptance_by_position_equals_a_per_request_count():
    """The grouped count (one pass per distinct bucket/accepted pair) equals counting request by request."""
    import random

    from sglang_ctxprof.aggregate import acceptance as acc_mod
    from sglang_ctxprof.model.records import RankId, StepRecord

    rng = random.Random(7)
    agg, want = Aggregator(), {}
    for step in range(200):
        n = rng.choice((1, 3, 64, 256))
        ctx = tuple(rng.randint(1, 9000) for _ in range(n))
        accepted = tuple(rng.randint(0, 5) for _ in range(n))  # 0: unknown, not counted
        depth = rng.choice((0, 3, 4))
        agg.observe(StepRecord(step_id=step, kind="decode", algorithm="EAGLE", rank=RankId(0, 0, 0),
                               rids=tuple(f"r{step}-{j}" for j in range(n)), ctx_lens=ctx, accepted=accepted,
                               committed=accepted, finished=(False,) * n, draft_tokens=5, step_ms=1.0,
                               phases_ms={}, draft_depth=depth))
        for c, a in zip(ctx, accepted):
            if a > 0:
                acc_mod.add(want.setdefault(agg.bucketing.index(c), {}), depth or 4, a - 1)
    assert agg.acceptance == want


def test_profile_timing_is_the_best_label_seen_not_the_last():
    agg = Aggregator()
    for i, label in enumerate(("cuda_graph", "cuda_graph_events", "cuda_graph", "cuda_events")):
        r = rec(60 + i, (1000,))
        agg.observe(StepRecord.from_dict({**r.to_dict(), "timing": label}))
    assert agg.snapshot().timing == "cuda_graph_events"


def test_stages_take_a_large_record_in_pieces_with_the_result_of_observe():
    from sglang_ctxprof.aggregate.requests import CHUNK

    n = 3 * CHUNK
    big = rec(1, [1000 + k for k in range(n)], acc=(3,), fin=(False,) * (n - 1) + (True,))
    whole, staged = Aggregator(), Aggregator()
    whole.observe(big)
    pieces = sum(1 for _ in staged.stages(big))
    assert pieces == 3 + 2 + 1  # bucket counts | acceptance counts | phase folds | 3 chunks of requests | audit
    assert staged.state(with_request_steps=True) == whole.state(with_request_steps=True)
    assert staged.audit.status() == whole.audit.status()


def test_state_reuses_the_dicts_of_unchanged_buckets_and_equals_a_fresh_write():
    import random

    rng = random.Random(7)
    agg = Aggregator()
    for step in range(300):
        ctx = [rng.choice((100, 900, 3000, 9000)) + rng.randint(0, 50) for _ in range(rng.randint(1, 3))]
        kind = "prefill" if step % 17 == 0 else "decode"
        agg.observe(rec(step, ctx, kind=kind, fin=(step % 5 == 0,) * len(ctx)))
        if step % 7 == 0:  # a read now and then: the cached dicts must equal a fresh write every time
            assert agg.state(with_requests=False) == agg.snapshot(with_requests=False).to_dict()
    first = agg.state(with_requests=False)
    agg.observe(rec(999, (100,)))  # one step, in the bucket of context 100 only
    again = agg.state(with_requests=False)
    assert again == agg.snapshot(with_requests=False).to_dict()
    changed = str(agg.bucketing.index(100))
    assert again["decode"][changed] is not first["decode"][changed]
    assert again["decode"][changed]["steps"] == first["decode"][changed]["steps"] + 1
    others = [k for k in again["decode"] if k != changed]
    assert others and all(again["decode"][k] is first["decode"][k] for k in others)
    assert all(again["prefill"][k] is first["prefill"][k] for k in again["prefill"])
    agg.reset()
    assert agg.state(with_requests=False)["decode"] == {}


def test_state_carries_the_device_facts_it_is_given():
    agg = Aggregator()
    agg.observe(rec(1, (100,)))
    assert agg.state(hw={"device": "cpu"})["meta"]["hw"] == {"device": "cpu"}
    assert agg.state()["meta"]["hw"] is None


def test_a_state_written_between_two_stages_of_a_record_is_not_reused_after_it():
    agg = Aggregator()
    agg.observe(rec(1, (100,)))
    stages = agg.stages(rec(2, (100,), step_ms=30.0))
    next(stages)  # the bucket counts are in, the phase folds not yet
    agg.state(with_requests=False)
    for _ in stages:
        pass
    bucket = agg.state(with_requests=False)["decode"][str(agg.bucketing.index(100))]
    assert bucket["steps"] == 2 and bucket["phases"]["step"]["n"] == 2 and bucket["phases"]["step"]["max"] == 30.0


def test_steps_gone_unrecorded_are_no_host_gap():
    """Profiling stopped, or a step lost (``interrupt``): the server ran steps meanwhile, so the
    time to the next recorded step is no gap between two steps."""
    agg = Aggregator()
    t0 = 10**18
    agg.observe(replace(rec(1, [100]), t_start_ns=t0))
    agg.observe(replace(rec(2, [100]), t_start_ns=t0 + 11 * 10**6))  # 1 ms after the first ended
    agg.interrupt()
    agg.observe(replace(rec(3, [100]), t_start_ns=t0 + 5 * 10**9))
    assert agg.host_gaps.count == 1 and agg.host_gaps.max < 2.0


def test_a_prefill_bucket_counts_sglangs_retractions_and_the_tokens_re_prefills_appended():
    agg = Aggregator()
    agg.observe(replace(rec(1, [300, 300], acc=(0,), kind="prefill"), committed=(1, 0), retractions=(1, 1)))
    (b,) = agg.prefill.values()
    assert (b.retractions, b.committed) == (2, 1)  # b's retraction hit its prefill in flight: no token
    agg.observe(replace(rec(2, [300], acc=(0,), kind="prefill"), committed=(1,)))  # saved without the counts
    assert (b.retractions, b.committed) == (3, 2)


def test_histories_retired_for_stalled_sinks_are_bounded_and_their_markers_stay_in_step():
    """Sinks stalled over many resets: at most ``MAX_RETIRED`` retired histories wait; the markers
    of the ones let go of early let go of nothing, so each later one still frees its own."""
    from sglang_ctxprof.aggregate.aggregator import MAX_RETIRED

    agg = Aggregator()
    logs = []
    for i in range(MAX_RETIRED + 2):
        logs.append(agg.requests)
        agg.reset()
    assert list(agg.retired) == logs[2:] and agg.retired_dropped == 2
    agg.drop_retired()
    agg.drop_retired()  # the markers of the two let go of early
    assert list(agg.retired) == logs[2:]
    agg.drop_retired()
    assert list(agg.retired) == logs[3:]


def test_a_chunked_prompt_is_one_request_of_its_prompt_tokens_in_its_prefill_bucket():
    """A 1000-token prompt prefilled in 8 chunks (each row carries the whole prompt; the cache hit
    counts at the first): one request and 1000 tokens, so cached / tokens is SGLang's ratio.  Its
    re-prefill after a retraction starts a prefill again; a decode row riding a chunk is no prompt."""
    from sglang_ctxprof.views.profile import build_profile

    def pre(i, rids, ctx, cached=(), committed=None, retractions=(), accepted=None):
        n = len(rids)
        return StepRecord(step_id=i, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=tuple(rids),
                          ctx_lens=tuple(ctx), accepted=tuple(accepted or (0,) * n),
                          committed=tuple(committed or (0,) * n), finished=(False,) * n, draft_tokens=0,
                          step_ms=5.0, cached_lens=tuple(cached), prompt_lens=tuple(ctx),
                          retractions=tuple(retractions))

    def dec(i, rid, ctx):
        return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(ctx,),
                          accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4, step_ms=4.0)

    agg = Aggregator()
    agg.observe(pre(1, ["a"], [1000], cached=[400]))
    for k in range(2, 9):
        agg.observe(pre(k, ["a"], [1000], cached=[0]))
    pf = {p.label: p for p in build_profile(agg.snapshot()).prefill}["512-1023"]
    assert (pf.batches, pf.requests, pf.tokens, pf.cached_tokens) == (8, 1, 1000, 400)
    agg.observe(dec(9, "a", 1001))
    agg.observe(pre(10, ["b", "a"], [900, 1003], committed=[0, 1], accepted=[0, 1]))  # a rides b's chunk
    agg.observe(pre(11, ["b"], [900]))  # b's second chunk
    agg.observe(pre(12, ["a"], [1003], committed=[1], retractions=[1]))  # a retracted, prefilled again
    pf = {p.label: p for p in build_profile(agg.snapshot()).prefill}["512-1023"]
    assert (pf.batches, pf.requests, pf.tokens) == (11, 3, 1000 + 900 + 1003)


def test_a_request_retracted_then_aborted_before_its_re_prefill_counts_in_the_retractions_total():
    """KV pressure where clients give up: the retraction has no re-prefill (no bucket), yet the total
    holds it, so Σ per-request retractions == totals.retractions; a counted one is not counted twice."""
    from sglang_ctxprof.model.records import RequestEnd
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    for i, rid in enumerate(("a", "b")):
        agg.observe(StepRecord(step_id=i, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                               ctx_lens=(100,), accepted=(0,), committed=(0,), finished=(False,), draft_tokens=0,
                               step_ms=5.0, prompt_lens=(100,)))
        agg.observe(StepRecord(step_id=10 + i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                               ctx_lens=(101,), accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4,
                               step_ms=4.0))
    agg.observe(StepRecord(step_id=20, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=("b",),
                           ctx_lens=(103,), accepted=(0,), committed=(1,), finished=(False,), draft_tokens=0,
                           step_ms=5.0, prompt_lens=(100,), retractions=(1,)))  # b: retracted, prefilled again
    agg.end_request(RequestEnd("a", retracted=True, t_ns=1, retractions=1))  # a: retracted, then aborted
    agg.end_request(RequestEnd("b", retracted=True, t_ns=2, retractions=1))  # b: its one is counted already
    prof = build_profile(agg.snapshot())
    assert [agg.request(r)["retractions"] for r in ("a", "b")] == [1, 1]
    assert prof.totals.retractions == 2 and sum(p.retractions for p in prof.prefill) == 1


def test_after_a_reset_an_aborted_retraction_counts_once_not_the_ones_before():
    """Retraction 1 was prefilled again before a reset; after it the request is retracted again and
    aborted while waiting: the window holds one retraction, though SGLang's count says 2."""
    from sglang_ctxprof.model.records import RequestEnd
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    agg.observe(StepRecord(step_id=1, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(103,),
                           accepted=(0,), committed=(1,), finished=(False,), draft_tokens=0, step_ms=5.0,
                           prompt_lens=(100,), retractions=(1,)))
    agg.reset()
    agg.observe(StepRecord(step_id=2, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(104,),
                           accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4, step_ms=4.0))
    agg.end_request(RequestEnd("a", retracted=True, t_ns=1, retractions=2))
    assert build_profile(agg.snapshot()).totals.retractions == 1
    assert agg.request("a")["retractions"] == 2  # the request's own: SGLang's count
