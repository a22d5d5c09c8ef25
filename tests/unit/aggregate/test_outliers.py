"""A few slow steps (warm-up, a kernel compiling) cannot flip the verdict: robust bucket means,
outliers reported apart with when they ran and "warm-up?"."""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator, merge_states
from sglang_ctxprof.aggregate.outliers import KEEP, OUTLIER_FACTOR
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile
from sglang_ctxprof.views.diagnosis_text import render_text
from sglang_ctxprof.views.profile import Profile, build_profile, summarize

MS = 1_000_000


def _rec(sid, ctx, draft, attn, t):
    ph = {"draft": draft, "verify": attn + 3.0, "verify_attn": attn, "verify_moe": 2.0, "verify_rest": 1.0,
          "draft_extend": 1.0, "overhead": 0.5}
    step = draft + attn + 3.0 + 1.0 + 0.5
    return StepRecord(sid, "decode", "EAGLE", RankId(), ("r%d" % ctx,), (ctx,), (3,), (3,), (False,), 4, step, ph,
                      t_start_ns=t, t_end_ns=t + int(step * MS), exec_mode="eager", attn_backend="intel_amx",
                      draft_depth=3, exec_reason="CUDA graphs disabled")


def profile(slow_at_start=(), slow_later=(), n=20):
    """Short context (71) then long (1507): attention 1 + 4 ms per 1k.  ``slow_at_start``: draft
    times (ms) of the server's first steps, in the short bucket; ``slow_later``: of steps in the
    middle of the long bucket (not the first of anything)."""
    agg = Aggregator()
    sid, t = 0, 10**18
    for ctx, slow, where in ((71, slow_at_start, 0), (1507, slow_later, n // 2)):
        for k in range(n):
            draft = slow[k - where] if where <= k < where + len(slow) else 3.0
            sid += 1
            agg.observe(_rec(sid, ctx, draft, 1.0 + 4.0 * ctx / 1e3, t))
            t += 20 * MS
    return agg


def test_planted_warmup_steps_do_not_flip_the_headline_and_are_named():
    clean = diagnose(evidence_from_profile(build_profile(profile().snapshot())))
    assert "decode is 40% slower" in clean["headline"]  # 8.78 ms against 14.53 ms per step
    # three steps of a kernel compiling (hundreds of ms) at the server's start, in the short bucket
    prof = build_profile(profile(slow_at_start=(420.0, 380.0, 300.0)).snapshot())
    assert prof.buckets[0].mean_ms("step") > prof.buckets[1].mean_ms("step")  # the mean alone says "faster"
    d = diagnose(evidence_from_profile(prof))
    h = d["headline"]
    assert h.startswith("at 1507 context decode is 40% slower than at 71"), h
    assert "verify_attn grows" in h and "3 slow steps set apart from the means above (in 64-127; warm-up?)" in h
    flag = next(f for f in d["flags"] if f["kind"] == "outlier_steps")
    assert flag["message"].startswith("bucket 64-127: 3 steps set apart (426, 386, 306 ms against a typical "
                                      "8.78 ms;")
    assert "in draft" in flag["message"] and "the first steps of the server: warm-up?" in flag["message"]
    r = d["outliers"]["64-127"]
    assert [o["ordinal"] for o in r["outliers"]] == [0, 1, 2] and all(o["warmup"] for o in r["outliers"])
    assert r["step_ms"] == pytest.approx(8.784) and r["phases"]["draft"] == pytest.approx(3.0)
    assert d["decomposition"]["lo"]["step_ms"] == pytest.approx(8.784)
    assert "[outlier_steps] bucket 64-127" in render_text(d)
    # the JSON round trip keeps it
    again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert diagnose(evidence_from_profile(again)) == d


def test_slow_steps_in_the_middle_of_a_bucket_are_not_called_warm_up():
    d = diagnose(evidence_from_profile(build_profile(profile(slow_later=(250.0, 260.0)).snapshot())))
    msg = next(f for f in d["flags"] if f["kind"] == "outlier_steps")["message"]
    assert msg.startswith("bucket 1024-2047: 2 steps set apart") and "warm-up" not in msg
    assert "warm-up" not in d["headline"] and "2 slow steps set apart" in d["headline"]
    assert "40% slower" in d["headline"]


def test_no_outliers_no_flag_and_leaves_still_add_up():
    prof = build_profile(profile(slow_at_start=(3.0 * OUTLIER_FACTOR,)).snapshot())  # at the fence: kept
    d = diagnose(evidence_from_profile(prof))
    assert not any(f["kind"] == "outlier_steps" for f in d["flags"]) and d["outliers"] == {}
    r = build_profile(profile(slow_at_start=(500.0,)).snapshot()).buckets[0].robust
    leaves = sum(v for p, v in r["phases"].items() if p not in ("verify",))
    assert leaves == pytest.approx(r["step_ms"])


def test_slow_steps_are_bounded_and_merge_across_ranks():
    agg = profile(slow_at_start=tuple(400.0 + i for i in range(KEEP + 5)), n=60)
    b = build_profile(agg.snapshot()).buckets[0].robust
    assert len(b["outliers"]) == KEEP and b["truncated"] is True
    st = agg.state()
    merged = summarize(merge_states([st, st]))  # identical ranks: ties on time and ordinals
    rb = merged["buckets"][0]["robust"]
    assert len(rb["outliers"]) == KEEP


def test_a_slow_unsplit_forward_is_named_as_the_phase_that_took_the_excess():
    """A plain step replayed in a CUDA graph whose split was not read carries its forward whole
    (``decode``): a slow one is named by it, as a split one is named by its part."""
    agg, t = Aggregator(), 10**18
    for sid in range(1, 21):
        fwd = 40.0 if sid == 12 else 9.0
        ph = {"decode": fwd, "overhead": 0.5}
        agg.observe(StepRecord(sid, "decode", "none", RankId(), ("r",), (1500,), (1,), (1,), (False,), 0,
                               fwd + 0.5, ph, t_start_ns=t, t_end_ns=t + int((fwd + 0.5) * MS)))
        t += 20 * MS
    b = next(b for b in build_profile(agg.snapshot()).buckets if b.steps)
    out = b.robust["outliers"]
    assert len(out) == 1 and out[0]["phase"] == "decode" and out[0]["phase_excess_ms"] == pytest.approx(31.0)
