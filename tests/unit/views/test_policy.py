"""views/policy.py: the policy from the configured trace part, tail-based decisions, run-time updates."""

from __future__ import annotations

import pytest

from sglang_ctxprof.model.config import CtxProfConfig, TraceSettings
from sglang_ctxprof.views.policy import TracePolicy

DEFAULT_SLOW_TOK_S, DEFAULT_SLOW_STEP_MS = TraceSettings().slow_tok_s, TraceSettings().slow_step_ms


def _policy(env):
    return TracePolicy.from_settings(CtxProfConfig.from_env(env).trace)


def _req(tok_s, steps=4, worst=10.0):
    return {"rid": "r", "steps": steps, "decode_tok_s": tok_s,
            "step_rows": [{"step_ms": 1.0}] * (steps - 1) + [{"step_ms": worst}] if steps else []}


def test_defaults_are_documented_values():
    p = _policy({})
    assert (p.mode, p.slow_tok_s, p.slow_step_ms) == ("off", DEFAULT_SLOW_TOK_S, DEFAULT_SLOW_STEP_MS)
    assert p.should_export(_req(0.1)) == (False, "decode_tok_s 0.1 < 20")


def test_slow_mode_exports_exactly_the_slow_ones():
    p = _policy({"SGLANG_CTXPROF_TRACE": "slow", "SGLANG_CTXPROF_SLOW_TOK_S": "50",
                              "SGLANG_CTXPROF_SLOW_STEP_MS": "100"})
    assert p.should_export(_req(100.0))[0] is False
    ok, why = p.should_export(_req(10.0))
    assert ok and "decode_tok_s" in why
    ok, why = p.should_export(_req(100.0, worst=150.0))
    assert ok and "step 150.0 ms > 100 ms" in why
    assert p.should_export(_req(0.0, steps=0))[0] is False  # finished at prefill: no decode speed


def test_all_mode_exports_everything_and_zero_disables_criteria():
    p = _policy({"SGLANG_CTXPROF_TRACE": "ALL", "SGLANG_CTXPROF_SLOW_TOK_S": "0",
                              "SGLANG_CTXPROF_SLOW_STEP_MS": "0"})
    assert p.should_export(_req(0.5, worst=1e6)) == (True, "")
    assert not p.step_is_slow(1e9)


@pytest.mark.parametrize("env,match", [
    ({"SGLANG_CTXPROF_TRACE": "sometimes"}, "off, slow, all"),
    ({"SGLANG_CTXPROF_SLOW_TOK_S": "fast"}, "not a number"),
    ({"SGLANG_CTXPROF_SLOW_STEP_MS": "-1"}, ">= 0"),
    ({"SGLANG_CTXPROF_SLOW_STEP_MS": "nan"}, ">= 0"),
])
def test_bad_env_is_a_clear_error(env, match):
    with pytest.raises(ValueError, match=match):
        _policy(env)


def test_runtime_update():
    p = TracePolicy().updated({"mode": "slow", "slow_tok_s": 7})
    assert p.mode == "slow" and p.slow_tok_s == 7.0 and p.to_dict()["slow_step_ms"] == DEFAULT_SLOW_STEP_MS
    with pytest.raises(ValueError, match="unknown"):
        p.updated({"speed": 1})
    with pytest.raises(ValueError):
        p.updated({"mode": "maybe"})


def test_a_threshold_is_a_number_not_a_boolean_and_minus_zero_is_zero():
    p = TracePolicy()
    for bad in (True, False):
        with pytest.raises(ValueError, match="not a number"):
            p.updated({"slow_tok_s": bad})
    assert str(p.updated({"slow_step_ms": -0.0}).slow_step_ms) == "0.0"


def test_an_unknown_field_is_named_in_ascii():
    """The error names the client's field as ``ascii()`` writes it: a reply no encoder refuses (a lone
    surrogate, a control character), a few of them, each cut short."""
    from sglang_ctxprof.views.policy import TracePolicy

    with pytest.raises(ValueError) as e:
        TracePolicy().updated({"\ud800": 1, "a\x1bb" + "x" * 100: 2})
    msg = str(e.value)
    assert msg.isascii() and msg.isprintable() and "'\\ud800'" in msg and len(msg) < 150, msg
