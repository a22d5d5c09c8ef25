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
        reason="CUDA graphs disabled", moe=2.0, idle_ms=0.0, ctxs=CTXS, attn_sq=0.0, then=()):
    """A profile of batch-1 steps at several contexts: attention = 1 + slope * ctx/1k (+ attn_sq *
    (ctx/1k)^2) ms; ``then``: (ctx, extra ms of overhead) steps after them, one each."""
    agg = Aggregator()
    t, sid = BASE, 0
    for ctx, k, extra in [(c, k, 0.0) for c in ctxs for k in range(n)] + [(c, 0, x) for c, x in then]:
        sid += 1
        attn = 1.0 + attn_slope * ctx / 1e3 + attn_sq * (ctx / 1e3) ** 2
        ph = {"draft": 3.0, "verify": attn + moe + 1.0, "verify_attn": attn, "verify_moe": moe, "verify_rest": 1.0,
              "draft_extend": 1.0, "overhead": 0.5 + extra}
        step = 3.0 + attn + moe + 1.0 + 1.0 + 0.5 + extra
        agg.observe(StepRecord(sid, "decode", "EAGLE", RankId(), ("r%d" % ctx,), (ctx + k,), (accept(ctx),),
                               (accept(ctx),), (False,), 4, step, ph, t_start_ns=t, timing=timing,
                               t_end_ns=t + int(step * MS), exec_mode=mode, attn_backend="intel_amx",
                               draft_depth=3, exec_reason=reason))
        t += int((step + gap_ms) * MS)
        if k == n - 1:
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


def test_a_rank_that_did_not_answer_or_a_failed_component_makes_the_verdict_say_it_is_partial():
    """A merged read serves what answered (200): the diagnosis says which ranks are missing or
    stopped recording, so a verdict from part of the server does not read as the whole."""
    ok = {"status": {"enabled": True}}
    prof = run().served(ranks=(ok, {"error": "rank 1: control timed out"}),
                        degraded=[{"components": {"aggregator": "RuntimeError: x"}}])
    d = diagnose(evidence_from_profile(prof))
    [flag] = [f for f in d["flags"] if f["kind"] == "partial"]
    assert "rank 1 did not answer: rank 1: control timed out" in flag["message"]
    assert "stopped recording on a rank: aggregator failed" in flag["message"] and "partial" in render_text(d)
    for whole in (run().served(ranks=(ok, ok)),  # every rank answered; an output's failure keeps the record
                  run().served(ranks=(ok,), degraded=[{"components": {"logs": "OSError: No space left"}}])):
        assert not [f for f in diagnose(evidence_from_profile(whole))["flags"] if f["kind"] == "partial"]


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


def test_a_bucket_of_fewer_than_five_steps_is_no_end_of_the_comparison():
    """30 steps in each bucket, then one slow step at a longer context (a request just crossing into a
    new bucket, its first step at a new shape): the verdict compares the buckets with data, and says
    which thin bucket it left out."""
    d = diagnose(evidence_from_profile(run(n=30, then=((9000, 250.0),))))
    dec = d["decomposition"]
    assert dec["hi"]["label"] == "4096-8191" and dec["left_out"] == ["128-255", "8192-16383"]  # 2 and 1 steps
    assert d["headline"].startswith("at 6014 context decode is")
    assert "verify_attn grows" in d["headline"] and "overhead" not in d["headline"].split(";")[2]
    assert "8192-16383: 1 step, too few to compare" in d["headline"]
    # with no bucket thick enough, the thin ones are compared (better than nothing) and said so
    thin = diagnose(evidence_from_profile(run(n=2)))["decomposition"]
    assert thin["hi"]["label"] == "4096-8191" and thin["left_out"] == []


def test_a_baseline_profile_is_paired_by_bucket_not_by_its_mean_context():
    """The same workload run twice: each bucket's mean context a few tokens apart.  Nothing changed,
    so nothing regresses, with one bucket or several, and on a curve the line through A would miss."""
    one = [evidence_from_profile(run(ctxs=(c,)), source=s) for c, s in ((1500, "A"), (1503, "B"))]
    b1 = diagnose(one[1], one[0])["baseline"]
    assert b1["comparable"] and b1["regressions"] == [] and {c["source"] for c in b1["checks"]} == {"measured"}
    a, b = (evidence_from_profile(run(ctxs=tuple(c + dx for c in CTXS), attn_sq=1.0)) for dx in (0, 1))
    many = diagnose(b, a)["baseline"]
    assert many["regressions"] == [] and many["verdict"].startswith("no phase changed")
    far = evidence_from_profile(run(ctxs=(1100, 2100, 3100, 5000)))  # the same buckets, means far apart
    assert {c["source"] for c in diagnose(far, a)["baseline"]["checks"] if c["ctx"] > 1000} == {"A fit"}


def test_a_slower_step_is_reported_beside_an_acceptance_regression():
    """The step is left out only where a leaf phase names the regression, not whenever anything else
    regressed too."""
    from sglang_ctxprof.views.diagnosis import Evidence, Point

    def ev(al, bump):
        ph = {p: 2.0 + bump for p in ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead")}
        step = sum(ph.values())
        return Evidence("x", tuple(Point(str(c), float(c), float(c), 100, al, step, {**ph, "step": step})
                                   for c in (1000, 4000)), {})

    found = {r["phase"] for r in diagnose(ev(2.5, 0.11), ev(3.0, 0.0))["baseline"]["regressions"]}
    assert found == {"accept_per_step", "step"}
    assert {r["phase"] for r in diagnose(ev(3.0, 1.0), ev(3.0, 0.0))["baseline"]["regressions"]} >= {"draft"}
    assert "step" not in {r["phase"] for r in diagnose(ev(3.0, 1.0), ev(3.0, 0.0))["baseline"]["regressions"]}


def test_whatif_counts_a_verify_that_ran_whole_in_a_cuda_graph():
    """Steps whose verify ran in a CUDA graph with no attention/MoE split: the predicted step is the
    whole forward plus the other leaves, as measured, not the other leaves alone."""
    agg = Aggregator()
    t, sid = BASE, 0
    for ctx in (500, 1500, 3000, 6000):
        for k in range(6):
            sid += 1
            v = 6.0 + 0.5 * ctx / 1e3
            ph = {"draft": 3.0, "verify": v, "draft_extend": 1.0, "overhead": 0.5}
            step = 3.0 + v + 1.0 + 0.5
            agg.observe(StepRecord(sid, "decode", "EAGLE", RankId(), ("r",), (ctx + k,), (3,), (3,), (False,), 4,
                                   step, ph, t_start_ns=t, timing="cuda_graph", t_end_ns=t + int(step * MS),
                                   exec_mode="graph", attn_backend="fa3", draft_depth=3))
            t += int((step + 0.1) * MS)
    at = diagnose(evidence_from_profile(build_profile(agg.snapshot())), ctx=3000)["whatif"]["at"]
    assert at["step_ms"] == pytest.approx(3.0 + 7.5 + 1.0 + 0.5, rel=0.01)


def test_the_measured_budget_advice_reads_wall_steps_as_the_ledger_does():
    """With a plain arm, the advice's rate at the budget run is the ledger's own speculative rate
    (both steps with their host time between steps), not a step without it against a plain one with."""
    spec = evidence_from_profile(run(accept=lambda c: 2, gap_ms=6.0, n=20, ctxs=(1500, 3000)), source="spec")
    plain_prof = run(accept=lambda c: 1, gap_ms=6.0, n=20, ctxs=(1500, 3000))
    plain = evidence_from_profile(plain_prof, source="plain")
    plain = type(plain)(plain.source, tuple(
        type(p)(p.label, p.ctx, p.ctx_sum, p.steps, 1.0, p.step_ms - 4.0,
                {"decode": p.step_ms - 4.5, "overhead": 0.5, "step": p.step_ms - 4.0,
                 **({"host_gap": p.phases["host_gap"]} if "host_gap" in p.phases else {})}) for p in plain.points), {})
    d = diagnose(spec, plain=plain)
    rows = {r["label"]: r for r in d["ledger"]["rows"]}
    for a in d["whatif"]["draft_budget"]:
        r = rows[a["bucket"]]
        k = max(a["rates"])
        assert a["rates"][k] == pytest.approx(1e3 * r["al"] / r["step_ms"], rel=1e-6)
        assert a["rates"][0] == pytest.approx(1e3 / r["plain_step_ms"], rel=1e-6)


def test_when_the_speed_barely_changes_acceptance_and_step_time_are_not_shared_out_in_percent():
    """Acceptance 4 -> 5 while the step grows by as much: tok/s moves under 1%, and a share of that
    (thousands of percent) says nothing.  The headline says they about cancel; the shares are null."""
    d = diagnose(evidence_from_profile(run(attn_slope=0.5668, ctxs=(1000, 5000),
                                            accept=lambda c: 4 if c < 2000 else 5)))
    dec, h = d["decomposition"], d["headline"]
    assert abs(dec["drop_pct"]) < 1 and dec["acceptance_share"] is None and dec["step_time_share"] is None
    assert "% of the change" not in h and "0% slower" not in h
    assert "decode is about as fast as at 1002" in h
    assert "acceptance rises 4.00 -> 5.00 and the step time grows with it (" in h and "they about cancel" in h
    assert "shares of the change: none" in render_text(d)


def test_a_thin_bucket_is_left_out_of_the_baseline_the_ledger_and_the_advice_too():
    """The bucket the headline calls too few to compare is compared nowhere else either: its one slow
    step is no regression against a baseline, and no speculation row of the ledger."""
    now = evidence_from_profile(run(n=30, then=((9000, 250.0),)))
    base = diagnose(now, evidence_from_profile(run(n=30)))["baseline"]
    assert base["regressions"] == [] and all(c["ctx"] < 8192 for c in base["checks"])
    spec = evidence_from_profile(run(accept=lambda c: 3, n=30, ctxs=(1500, 3000, 6000), then=((20000, 250.0),)))
    plain = evidence_from_profile(run(accept=lambda c: 1, n=30, ctxs=(1500, 3000, 6000, 20000)))
    d = diagnose(spec, plain=plain)
    assert "16384-32767" not in [r["label"] for r in d["ledger"]["rows"]] and "16384-32767: 1 step" in d["headline"]
    assert all(not a["bucket"].startswith("16384") for a in d["whatif"]["draft_budget"])


def test_one_bucket_with_enough_steps_and_a_thin_one_is_nothing_to_compare_yet():
    """With one bucket of enough steps, a thin one beside it is no second end: the headline says so
    and names the thin one, as every other part of the verdict leaves it out."""
    d = diagnose(evidence_from_profile(run(n=20, ctxs=(600,), then=((20000, 250.0),))))
    assert d["decomposition"] is None
    assert d["headline"].startswith("one context bucket with enough steps (512-1023): nothing to compare")
    assert "16384-32767: 1 step, too few to compare" in d["headline"]
    early = diagnose(evidence_from_profile(run(n=2)))
    assert "every bucket has fewer than 5 steps so far" in early["headline"]


def test_when_the_step_barely_changes_no_phase_gets_a_share_of_its_growth():
    """Acceptance falls while the step stays at 10.5 ms, attention growing as MoE shrinks: a phase's
    share of a 0.02 ms growth (5000%) says nothing; it is null and the headline names no share."""
    from sglang_ctxprof.views.diagnosis_evidence import Evidence, Point

    def pt(label, ctx, al, attn, moe):
        ph = {"draft": 3.0, "verify_attn": attn, "verify_moe": moe, "verify_rest": 1.0, "draft_extend": 1.0}
        return Point(label, ctx, ctx, 64, al, sum(ph.values()), ph)

    d = diagnose(Evidence("x", (pt("64-127", 100, 3.0, 1.0, 4.5), pt("4096-8191", 6000, 2.4, 3.02, 2.5)), {}))
    dec = d["decomposition"]
    assert dec["step_delta_ms"] == pytest.approx(0.02)
    assert all(v["share_of_step_growth"] is None for v in dec["phases"].values())
    assert "of the step-time growth" not in d["headline"] and "the step time barely changes" in d["headline"]
    assert "% of the step change" not in render_text(d)


def test_a_small_growth_of_one_phase_is_named_not_called_a_trade_off():
    from sglang_ctxprof.views.diagnosis_evidence import Evidence, Point

    def pt(label, ctx, attn):
        ph = {"draft": 3.0, "verify_attn": attn, "verify_moe": 4.5, "verify_rest": 1.0, "draft_extend": 1.0}
        return Point(label, ctx, ctx, 64, 3.0, sum(ph.values()), ph)

    h = diagnose(Evidence("x", (pt("64-127", 100, 1.0), pt("4096-8191", 6000, 1.45)), {}))["headline"]
    assert "the step time barely changes (10.5 -> 10.9 ms): verify_attn +0.45 ms" in h and "trade off" not in h
