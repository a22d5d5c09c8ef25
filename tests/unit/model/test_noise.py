"""The noise model's verdicts: a comparison that compared nothing says so (and why) instead of
"no significant change", and its exit code is 2, not 0 (fine) or 1 (regression)."""

from __future__ import annotations

import pytest

from sglang_ctxprof.model.noise import compare


def row(ctx: int, phases: bool = True, tok_s: float | None = 100.0, acc: float | None = 3.0) -> dict:
    st = {"draft": 3.0, "verify_attn": 1.0 + ctx / 1000, "step": 4.0 + ctx / 1000}
    return {"ctx": ctx,
            "phases_ms": {p: {"min": v, "second": v * 1.01} for p, v in st.items()} if phases else {},
            "accept_per_step": None if acc is None else {"median": acc, "spread": 0.01},
            "decode_tok_s": None if tok_s is None else {"median": tok_s, "spread": 0.5}}


def test_a_context_the_baseline_neither_measured_nor_can_fit_is_nothing_comparable():
    out = compare([row(64)], [row(5120)])
    assert out["checks"] == [] and out["verdict"] == "nothing comparable" and out["exit_code"] == 2
    assert "64" in out["why"] and "5120" in out["why"]


def test_no_quantity_in_common_is_nothing_comparable():
    # A: phases only (a profile); B: client tok/s only (a sweep without the profiler, no speculation)
    out = compare([row(64, tok_s=None, acc=None), row(1024, tok_s=None, acc=None)],
                  [row(64, phases=False, acc=None)])
    assert out["verdict"] == "nothing comparable" and out["exit_code"] == 2
    assert "share no measured quantity" in out["why"] and "B: decode_tok_s" in out["why"]
    assert "measured nothing" in compare([row(64)], [row(64, phases=False, tok_s=None, acc=None)])["why"]


def test_an_empty_run_is_nothing_comparable():
    assert compare([], [row(64)])["exit_code"] == 2
    assert compare([row(64)], [])["exit_code"] == 2


@pytest.mark.parametrize("b, verdict, code", [
    ([row(64), row(1024)], "no significant change", 0),
    ([row(64), row(5120)], "no significant change", 0),  # 5120 judged against the baseline's fit
])
def test_anything_compared_keeps_its_verdict(b, verdict, code):
    out = compare([row(64), row(1024)], b)
    assert out["checks"] and out["verdict"] == verdict and out["exit_code"] == code


def test_a_quantity_that_was_zero_is_a_regression_said_in_words():
    a, b = [row(64), row(1024)], [row(64), row(1024)]
    for r in a:
        r["phases_ms"]["overhead"] = {"min": 0.0, "second": 0.0}
    for r in b:
        r["phases_ms"]["overhead"] = {"min": 0.5, "second": 0.5}
    out = compare(a, b)
    assert out["verdict"] == "regression" and out["exit_code"] == 1
    assert "overhead at ctx 64: 0 -> 0.5 (from 0, noise" in out["why"]
