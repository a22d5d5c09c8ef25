"""``sweep --arms spec,plain`` offline: the plain server's arguments, argument errors, and the arms
report (table, crossover, ledger) from saved result directories."""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.sweep_arms import arms_report, plain_args, render_arms


def test_plain_args_drop_every_speculative_flag():
    a = ["--model-path", "m", "--attention-backend", "intel_amx", "--speculative-algorithm", "EAGLE",
         "--speculative-num-steps", "3", "--speculative-draft-model-path=d", "--device", "cpu"]
    assert plain_args(a) == ["--model-path", "m", "--attention-backend", "intel_amx", "--device", "cpu"]


def test_argument_errors(tmp_path, capsys):
    assert main(["sweep", "--arms", "spec,plain", "--url", "http://x"]) == 2
    assert "--arms needs --out" in capsys.readouterr().err
    assert main(["sweep", "--arms", "spec,plain", "--out", str(tmp_path)]) == 2
    assert "--plain-url" in capsys.readouterr().err
    assert main(["sweep", "--arms", "spec,ar", "--out", str(tmp_path)]) == 2
    assert "--arms takes spec,plain" in capsys.readouterr().err


def _point(arm, ctx, rep, tok_s, al, step, attn):
    if arm == "spec":
        ph = {"draft": 3.0, "verify": attn + 6.0, "verify_attn": attn, "verify_moe": 4.0, "verify_rest": 2.0,
              "draft_extend": 1.0, "overhead": step - (3.0 + attn + 6.0 + 1.0)}
    else:
        ph = {"decode": attn + 6.0, "decode_attn": attn, "decode_moe": 4.0, "decode_rest": 2.0,
              "overhead": step - (attn + 6.0)}
    return {"ctx": ctx, "repeat": rep, "decode_tok_s": tok_s, "server_wall_tok_s": tok_s, "prompt_tokens": ctx, "cached_tokens": 0,
            "accept_per_step": al if arm == "spec" else None,
            "breakdown": {"steps": 10, "accepted_per_step": al, "phases_ms": {**ph, "step": step},
                          "server_tok_s": 1e3 * al / step, "host_gap_ms": 0.1}}


def test_arms_report_from_saved_directories(tmp_path):
    for arm in ("spec", "plain"):
        d = tmp_path / arm
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"arm": arm, "ctx": [1000, 4000, 8000]}))
        for ctx, (s_step, p_step, s_attn, p_attn) in {1000: (20.0, 10.0, 2.0, 1.0), 4000: (40.0, 12.0, 20.0, 3.0),
                                                       8000: (70.0, 15.0, 48.0, 6.0)}.items():
            for rep in range(2):
                al = 3.0 if arm == "spec" else 1.0
                step = s_step if arm == "spec" else p_step
                p = _point(arm, ctx, rep, 1e3 * al / (step + 0.1), al, step, s_attn if arm == "spec" else p_attn)
                (d / f"point-c{ctx:06d}-r{rep:02d}.json").write_text(json.dumps(p))
    rep = arms_report(tmp_path)
    t = {r["ctx"]: r for r in rep["table"]}
    assert t[1000]["speedup"] == pytest.approx(3.0 * 10.1 / 20.1)
    assert t[1000]["server"]["speedup"] == t[1000]["client"]["speedup"] == t[1000]["speedup"]
    assert t[1000]["predicted_speedup"] == pytest.approx(t[1000]["speedup"])
    c = rep["crossover"]
    assert c["how"] == "measured" and 1000 < c["ctx"] < 4000
    assert rep["ledger"]["attention"]["scales_worse"]
    text = "\n".join(render_arms(rep))
    assert "speculative vs plain decode" in text and "crossover (measured speedup < 1): ~" in text
    assert "the verify attention path scales worse than decode attention" in text
    assert main(["report", str(tmp_path)]) == 0  # the sweep report of an arms directory


def test_report_prints_the_arms_table(tmp_path, capsys):
    test_arms_report_from_saved_directories(tmp_path)
    assert "speculation ledger" in capsys.readouterr().out


def test_mean_and_95_ci_of_the_per_repeat_speedups():
    from sglang_ctxprof.cli.sweep_arms import mean_ci95

    out = mean_ci95([2.0, 2.2, 2.4, 2.6], "speedup")
    # mean 2.3, sd 0.2582, t(3) = 3.182: half-width 3.182 * 0.2582 / 2
    assert out["speedup_mean"] == pytest.approx(2.3)
    assert out["speedup_ci95"] == pytest.approx(3.182 * 0.258199 / 2, rel=1e-4)
    assert mean_ci95([2.0], "x") == {"x_mean": 2.0, "x_ci95": None}
    assert mean_ci95([], "x") == {"x_mean": None, "x_ci95": None}
    wide = mean_ci95([1.0 + 0.1 * (i % 2) for i in range(40)], "x")["x_ci95"]  # beyond the table: t at 10 df
    assert wide == pytest.approx(2.228 * 0.050637 / 40 ** 0.5, rel=1e-3)
