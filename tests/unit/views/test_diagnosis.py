"""The verdict from typed profiles: decomposition, slopes, physics, baseline, flags, what-if, CLI."""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile
from sglang_ctxprof.views.diagnosis_text import render_text
from sglang_ctxprof.views.profile import Profile, build_profile

MS = 1_000_000
BASE = 1_700_000_000 * 10**9
CTXS = (100, 600, 1500, 3000, 6000)


def run(attn_slope=0.5, accept=lambda ctx: 4, hw=None, timing="cpu", gap_ms=0.1, n=6, mode="eager",
        reason="CUDA graphs disabled", moe=2.0, idle_ms=0.0):
    """A profile of batch-1 steps at several contexts: attention = 1 + slope * ctx/1k ms."""
    agg = Aggregator()
    t, sid = BASE, 0
    for ctx in CTXS:
        for k in range(n):
            sid += 1
            attn = 1.0 + attn_slope * ctx / 1e3
            ph = {"draft": 3.0, "verify": attn + moe + 1.0, "verify_attn": attn, "verify_moe": moe, "verify_rest": 1.0,
                  "draft_extend": 1.0, "overhead": 0.5}
            step = 3.0 + attn + moe + 1.0 + 1.0 + 0.5
            agg.observe(StepRecord(sid, "decode", "EAGLE", RankId(), ("r%d" % ctx,), (ctx + k,), (accept(ctx),),
                                   (accept(ctx),), (False,), 4, step, ph, t_start_ns=t, timing=timing,
                                   t_end_ns=t + int(step * MS), exec_mode=mode, attn_backend="intel_amx",
                                   draft_depth=3, exec_reason=reason))
            t += int((step + gap_ms) * MS)
        t += int(idle_ms * MS)  # the server idle between two contexts' requests
    snap = agg.snapshot().with_hw(hw)
    return build_profile(snap)


def test_headline_and_decomposition_charge_step_time_when_acceptance_is_flat():
    d = diagnose(evidence_from_profile(run()))
    dec = d["decomposition"]
    assert dec["log_tok_s_ratio"] == pytest.approx(dec["log_al_ratio"] + dec["minus_log_step_ratio"])
    assert dec["log_al_ratio"] == pytest.approx(0.0) and dec["step_time_share"] == pytest.approx(1.0)
    assert dec["phases"]["verify_attn"]["share_of_step_growth"] == pytest.approx(1.0)
    h = d["headline"]
    assert h.startswith("at 6002 context decode is") and "acceptance is unchanged" in h
    assert "verify_attn grows +0.50 ms per 1k" in h and "eager (CUDA graphs disabled)" in h
    assert "no baseline given" in h
    assert d["phases"]["verify_attn"]["method"] == "theil-sen"
    assert d["physics"]["available"] is False and "CPU" in d["physics"]["reason"]
    assert render_text(d).splitlines()[2] == h


def test_falling_acceptance_is_charged_to_acceptance():
    d = diagnose(evidence_from_profile(run(attn_slope=0.0, accept=lambda c: 4 if c < 1000 else 2)))
    dec = d["decomposition"]
    assert dec["acceptance_share"] == pytest.approx(1.0, abs=0.05) and dec["drop_pct"] > 40
    assert "acceptance falls 4.00 -> 2.00" in d["headline"]
    assert any(f["kind"] == "acceptance_falls" for f in d["flags"])


def test_attention_regression_against_a_baseline():
    base = evidence_from_profile(run(attn_slope=0.5), source="baseline")
    now = evidence_from_profile(run(attn_slope=2.0), source="now")
    d = diagnose(now, base)
    regs = d["baseline"]["regressions"]
    assert regs and regs[0]["phase"] == "verify_attn"
    assert regs[0]["slope_now"] > regs[0]["slope_baseline"]
    assert "regression in verify_attn" in d["headline"]
    same = diagnose(evidence_from_profile(run(attn_slope=0.5)), base)
    assert same["baseline"]["regressions"] == [] and "no phase changed beyond noise" in same["headline"]


def test_a_phase_that_was_zero_in_the_baseline_regresses_in_words():
    """A leaf can be 0 (no MoE block fired, a clamped remainder): no percentage of 0, no crash."""
    d = diagnose(evidence_from_profile(run(moe=2.0)), evidence_from_profile(run(moe=0.0), source="baseline"))
    regs = d["baseline"]["regressions"]
    assert [r["phase"] for r in regs] == ["verify_moe"] and regs[0]["delta_pct"] is None
    assert "regression in verify_moe: 0 -> 2 at ctx" in d["headline"] and "(from 0, noise" in d["headline"]


def test_physics_on_a_gpu_names_inherent_or_kernel_problem():
    # 1 MB of KV per token at 1000 GB/s: the roofline slope is 1 ms per 1k tokens
    hw = {"device": "X", "hbm_gbps": 1000.0, "kv_bytes_per_token": 1e6, "source": "test"}
    ok = diagnose(evidence_from_profile(run(attn_slope=1.5, hw=hw, timing="cuda_events")))
    assert ok["physics"]["ratio"] == pytest.approx(1.5, rel=0.01)
    assert ok["physics"]["verdict"].startswith("inherent: attention over a long KV cache, at 67% of the HBM")
    bad = diagnose(evidence_from_profile(run(attn_slope=47.0, hw=hw, timing="cuda_events")))
    assert bad["physics"]["verdict"].startswith("attention is 47x slower than the memory system allows")
    assert bad["whatif"]["attention_at_roofline"]["speedup"] > 5


def test_flags_host_bubbles_downgrade_and_lost_records():
    d = diagnose(evidence_from_profile(run(gap_ms=10.0)))
    assert [f["kind"] for f in d["flags"]] == ["host_bubbles"]
    d = diagnose(evidence_from_profile(run(mode="eager", reason="batch size 9 larger than the largest captured (8)")))
    assert d["flags"][0]["kind"] == "downgrade" and "largest captured" in d["headline"]
    prof = run().served(dropped=3)
    assert any(f["kind"] == "lost_records" for f in diagnose(evidence_from_profile(prof))["flags"])


def test_a_server_idle_between_requests_has_no_host_bubbles():
    """A minute with no request is not scheduler overhead: the typical gap counts, as in the ledger."""
    d = diagnose(evidence_from_profile(run(gap_ms=0.1, idle_ms=60_000.0)))
    assert [f["kind"] for f in d["flags"]] == []


def test_whatif_prediction_range_and_budget_advice():
    d = diagnose(evidence_from_profile(run()), ctx=3000)
    at = d["whatif"]["at"]
    assert at["extrapolation"] is False and at["step_ms"] == pytest.approx(3 + 1 + 1.5 + 2 + 1 + 1 + 0.5, rel=0.02)
    far = diagnose(evidence_from_profile(run()), ctx=50000)["whatif"]["at"]
    assert far["extrapolation"] is True and "extrapolation" in far["note"]
    adv = d["whatif"]["draft_budget"]
    assert adv and all("assumed" in a and "measured" in a for a in adv)
    assert adv[0]["best_budget"] == 3  # every draft accepted: the full budget pays


def test_diagnosis_survives_the_json_round_trip():
    prof = run()
    again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert diagnose(evidence_from_profile(again)) == diagnose(evidence_from_profile(prof))


def test_cli_diagnose_offline_on_saved_profiles(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run(attn_slope=0.5).to_dict()))
    b.write_text(json.dumps(run(attn_slope=2.0).to_dict()))
    assert main(["diagnose", str(b), "--baseline", str(a)]) == 1
    out = capsys.readouterr().out
    assert "regression in verify_attn" in out
    assert main(["diagnose", str(a), "--json", "--ctx", "2048"]) == 0
    assert json.loads(capsys.readouterr().out)["whatif"]["at"]["ctx"] == 2048
    assert main(["diagnose", str(tmp_path / "nope.json")]) == 2
    assert "neither a saved profile" in capsys.readouterr().err


def test_a_baseline_with_nothing_comparable_says_so():
    one = evidence_from_profile(run(), source="now")
    empty = evidence_from_profile(Profile.from_dict({"buckets": []}), source="empty")
    d = diagnose(one, empty)
    assert d["baseline"]["comparable"] is False and d["baseline"]["checks"] == []
    assert d["baseline"]["verdict"].startswith("nothing comparable with the baseline")
    assert "no phase changed" not in d["headline"] and "nothing comparable" in d["headline"]
    same = diagnose(one, one)["baseline"]
    assert same["comparable"] is True and same["checks"]
