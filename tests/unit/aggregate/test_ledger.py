"""The speculation ledger: speedup from measured plain-decode steps, saved/spent adding up, verify
inflation and its slope, crossover, and ``diagnose --plain`` on saved profiles."""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.ledger import ledger
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile, ledger_points
from sglang_ctxprof.views.profile import build_profile

CTXS = (1000, 4000, 8000, 16000)


def plain_pt(ctx, attn_per_1k=0.2, gap=0.0):
    attn = 0.5 + attn_per_1k * ctx / 1e3
    ph = {"decode": attn + 6.0, "decode_attn": attn, "decode_moe": 4.0, "decode_rest": 2.0, "overhead": 0.5}
    if gap:
        ph["host_gap"] = gap
    return {"ctx": ctx, "label": str(ctx), "al": 1.0, "phases": {**ph, "step": ph["decode"] + 0.5}}


def spec_pt(ctx, al=3.0, attn_per_1k=0.3, gap=0.0):
    attn = 0.8 + attn_per_1k * ctx / 1e3
    ph = {"draft": 3.0, "verify": attn + 8.0, "verify_attn": attn, "verify_moe": 5.0, "verify_rest": 3.0,
          "draft_extend": 1.0, "overhead": 0.7}
    if gap:
        ph["host_gap"] = gap
    return {"ctx": ctx, "label": str(ctx), "al": al,
            "phases": {**ph, "step": ph["draft"] + ph["verify"] + ph["draft_extend"] + ph["overhead"]}}


def test_rows_add_up_and_the_speedup_is_al_times_plain_over_step():
    led = ledger([spec_pt(c) for c in CTXS], [plain_pt(c) for c in CTXS])
    for r in led["rows"]:
        assert r["speedup"] == pytest.approx(r["al"] * r["plain_step_ms"] / r["step_ms"])
        assert sum(r["spent_ms"].values()) == pytest.approx(r["step_ms"] - r["plain_step_ms"])
        assert r["saved_ms"] - sum(r["spent_ms"].values()) == pytest.approx(r["net_ms"])
        assert r["plain_from"] == "measured"
    assert led["rows"][0]["verify_inflation"] == pytest.approx((0.8 + 0.3) / (0.5 + 0.2))
    assert led["rows"][0]["moe_inflation"] == pytest.approx(5.0 / 4.0)


def test_verify_attention_scaling_worse_is_named_and_moves_the_crossover():
    fine = ledger([spec_pt(c, attn_per_1k=0.2) for c in CTXS], [plain_pt(c) for c in CTXS])
    assert "scales like decode attention" in fine["attention"]["verdict"]
    bad = ledger([spec_pt(c, attn_per_1k=1.5) for c in CTXS], [plain_pt(c) for c in CTXS])
    a = bad["attention"]
    assert a["scales_worse"] and a["verify"]["ms_per_1k"] == pytest.approx(1.5)
    assert a["decode"]["ms_per_1k"] == pytest.approx(0.2)
    assert a["verdict"] == ("the verify attention path scales worse than decode attention: +1.500 ms per 1k "
                            "against +0.200; at 32k that is 42.9 ms per step")
    assert "the verify attention path scales worse" in bad["verdict"]
    infl = [r["verify_inflation"] for r in bad["rows"]]
    assert infl == sorted(infl) and infl[-1] > 2 * infl[0]
    # speedup 3 x T_plain / T_step falls below 1 between 8k and 16k: measured, interpolated
    c = bad["crossover"]
    assert c["how"] == "measured" and 8000 < c["ctx"] < 16000
    assert fine["crossover"]["how"] == "extrapolated"
    assert fine["crossover"]["ctx"] is None or fine["crossover"]["ctx"] > c["ctx"]


def test_a_constant_host_delay_is_overhead_and_moves_net_by_its_amount():
    base = ledger([spec_pt(c) for c in CTXS], [plain_pt(c) for c in CTXS])
    slow = ledger([spec_pt(c, gap=5.0) for c in CTXS], [plain_pt(c) for c in CTXS])
    for a, b in zip(base["rows"], slow["rows"]):
        assert b["spent_ms"]["overhead_extra"] - a["spent_ms"]["overhead_extra"] == pytest.approx(5.0)
        assert a["net_ms"] - b["net_ms"] == pytest.approx(5.0)
        assert b["verify_inflation"] == a["verify_inflation"]


def test_plain_interpolated_between_its_points_and_no_plain_is_assumed():
    led = ledger([spec_pt(2500)], [plain_pt(1000), plain_pt(4000)])
    r = led["rows"][0]
    assert r["plain_from"] == "interpolated"
    assert r["plain_step_ms"] == pytest.approx(plain_pt(2500)["phases"]["step"])
    assert ledger([spec_pt(1000)], [])["available"] is False


def _profile(plain: bool, attn_per_1k: float):
    agg = Aggregator()
    sid = 0
    for ctx in (500, 3000, 6000):
        for _ in range(6):
            sid += 1
            p = plain_pt(ctx, attn_per_1k) if plain else spec_pt(ctx, attn_per_1k=attn_per_1k)
            ph = {k: v for k, v in p["phases"].items() if k != "step"}
            agg.observe(StepRecord(sid, "decode", "NONE" if plain else "EAGLE", RankId(), ("r",), (ctx,),
                                   (1 if plain else 3,), (1 if plain else 3,), (False,), 0 if plain else 4,
                                   p["phases"]["step"], ph, draft_depth=0 if plain else 3))
    return build_profile(agg.snapshot())


def test_diagnose_with_a_plain_profile_offline(tmp_path, capsys):
    spec, plain = _profile(False, 1.5), _profile(True, 0.2)
    d = diagnose(evidence_from_profile(spec), plain=evidence_from_profile(plain, source="plain"))
    assert d["ledger"]["available"] and "the verify attention path scales worse" in d["headline"]
    adv = d["whatif"]["draft_budget"]
    assert adv and all("plain step at this context" in a["measured"] for a in adv)
    assert [p["phases"]["decode_attn"] for p in ledger_points(evidence_from_profile(plain))] == \
        pytest.approx([0.6, 1.1, 1.7])
    a, b = tmp_path / "spec.json", tmp_path / "plain.json"
    a.write_text(json.dumps(spec.to_dict()))
    b.write_text(json.dumps(plain.to_dict()))
    assert main(["diagnose", str(a), "--plain", str(b)]) == 0
    out = capsys.readouterr().out
    assert "speculation ledger" in out and "verify attention path scales worse" in out
    # a speculative profile as the plain arm would be a "measured" ledger of spec against spec
    assert main(["diagnose", str(a), "--plain", str(a)]) == 2
    err = capsys.readouterr().err
    assert str(a) in err and "speculative" in err and err.count("error:") == 1, err
    assert main(["diagnose", str(a)]) == 0
    out = capsys.readouterr().out
    assert "speculation ledger: unavailable (no plain-decode baseline: costs per draft position are assumed)" in out


def test_a_plain_point_of_the_same_bucket_is_measured_not_extrapolated():
    """Live profiles: the two arms' buckets share labels but not their exact mean contexts (a spec
    step commits several tokens); the plain step of the same bucket is the measurement."""
    spec = [dict(spec_pt(c), label=f"b{i}", ctx=c + 7) for i, c in enumerate((100, 3000))]
    plain = [dict(plain_pt(c), label=f"b{i}") for i, c in enumerate((100, 3000))]
    led = ledger(spec, plain)
    for r, p in zip(led["rows"], plain):
        assert r["plain_from"] == "measured"
        assert r["plain_step_ms"] == p["phases"]["step"] and r["decode_attn_ms"] == p["phases"]["decode_attn"]
    # without a shared label the same numbers are interpolated / extrapolated, and say so
    led = ledger([dict(s, label="x" + s["label"]) for s in spec], plain)
    assert [r["plain_from"] for r in led["rows"]] == ["interpolated", "extrapolated"]


def _line(ctx, step_ms, plain=False):
    ph = {"decode": step_ms} if plain else {"draft": 1.0, "verify": step_ms - 1.0}
    return {"ctx": ctx, "label": str(ctx), "al": 1.0 if plain else 2.0, "phases": {**ph, "step": step_ms}}


def test_a_spec_step_growing_faster_than_al_times_plain_does_not_keep_paying():
    """Spec step 16 + 3 ms per 1k, plain 10 + 1 ms per 1k, AL 2: the lines cross at 4k, the longest
    context measured (speedup 1.16 -> 1.00).  The spec step grows faster than AL x plain: speculation
    stops paying there, it does not keep paying at any context."""
    ctxs = (1000, 2000, 4000)
    spec = [_line(c, 16.0 + 3.0 * c / 1e3) for c in ctxs]
    plain = [_line(c, 10.0 + 1.0 * c / 1e3, plain=True) for c in ctxs]
    led = ledger(spec, plain)
    assert [r["speedup"] for r in led["rows"]] == pytest.approx([2 * 11 / 19, 2 * 12 / 22, 1.0])
    c = led["crossover"]
    assert "keeps paying" not in c["note"]
    assert c["how"] == "extrapolated" and c["ctx"] == pytest.approx(4000)
    assert "~4000 tokens" in c["note"] and "4000" in led["verdict"]
    # the fitted lines (spec 17.375 + 2.75 ms per 1k) crossing at 3.5k, before the longest context
    # measured, where the measured speedup is still above 1: the crossover is there at the earliest
    ctxs = (1000, 2000, 3000, 4000)
    spec = [_line(c, 17.0 + 3.0 * c / 1e3) for c in ctxs[:3]] + [_line(4000, 27.5)]  # 2 x 14 / 27.5 at 4k
    plain = [_line(c, 10.0 + 1.0 * c / 1e3, plain=True) for c in ctxs]
    c = ledger(spec, plain)["crossover"]
    assert c["ctx"] == pytest.approx(4000) and c["how"] == "extrapolated"
    assert "at the earliest" in c["note"] and "~3500 tokens" in c["note"] and "1.02x" in c["note"]


def test_two_plain_points_at_one_context_interpolate_without_a_division_by_zero():
    from sglang_ctxprof.aggregate.ledger import _interp

    assert _interp([(100.0, 2.0), (100.0, 4.0)], 50.0) == (3.0, "extrapolated")
    assert _interp([(100.0, 2.0), (100.0, 4.0), (300.0, 6.0)], 400.0) == (7.0, "extrapolated")


def test_two_plain_points_less_than_a_token_apart_extrapolate_flat():
    """Contexts of 1e-300 and 2e-300 tokens (a hand-made reference): their slope, followed to a real
    context, overflowed the ledger's fits.  Beyond two points that close the times stay flat."""
    from sglang_ctxprof.aggregate.ledger import _interp

    assert _interp([(1e-300, 0.0), (2e-300, 1.0)], 3000.0) == (1.0, "extrapolated")
    assert _interp([(100.0, 2.0), (300.0, 6.0)], 400.0) == (8.0, "extrapolated")
