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
    assert "speculative vs plain decode" in text
    assert "crossover (measured speedup < 1, the server speedups): ~" in text
    assert "the verify attention path scales worse than decode attention" in text
    assert main(["report", str(tmp_path)]) == 0  # the sweep report of an arms directory


def test_one_context_without_the_server_figure_makes_every_speedup_the_clients(tmp_path):
    """The table's speedups (and the crossover between them) are of one kind: the server's wall-clock
    figure where every context has it, else the client's everywhere."""
    test_arms_report_from_saved_directories(tmp_path)
    t = {r["ctx"]: r for r in arms_report(tmp_path)["table"]}
    assert {r["speedup_by"] for r in t.values()} == {"server"}
    for f in (tmp_path / "plain").glob("point-c004000-*.json"):
        p = json.loads(f.read_text())
        p["server_wall_tok_s"], p["decode_tok_s"] = None, p["decode_tok_s"] * 0.9  # the client's differs
        f.write_text(json.dumps(p))
    t = {r["ctx"]: r for r in arms_report(tmp_path)["table"]}
    assert {r["speedup_by"] for r in t.values()} == {"client"}
    assert all(r["speedup"] == r["client"]["speedup"] for r in t.values())


def test_a_speculative_plain_arm_is_refused(tmp_path, capsys):
    """``--plain-url`` naming the speculative server: the plain arm's points hold draft and verify
    phases, and a ledger of spec against spec would read as measured."""
    test_arms_report_from_saved_directories(tmp_path)
    spec, plain = tmp_path / "spec", tmp_path / "plain"
    for f in plain.glob("point-*.json"):
        f.write_text((spec / f.name).read_text())
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(plain) in err and "speculative" in err and err.count("error:") == 1, err


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


def _arm_point(arm, ctx, rep, load, bonus=1, step_missed_ms=0.0):
    """One repeat's point in the shape ``two_point`` writes, from a known timeline: the long request
    decodes 23 tokens (24 with the prefill's), spec in 7 steps of 60 ms accepting 24 tokens (the last
    step accepts one past max_new_tokens), plain in 23 steps of 15 ms; a host gap between steps; every
    time scaled by the repeat's ``load`` (the pair shares it).  The short request's single step is
    twice as slow as the long one's (a loaded machine's odd step), and it is in the pooled breakdown.
    ``bonus``: accepted tokens per step the profiler counts beyond the drafts (1: right);
    ``step_missed_ms``: time per step the profiler's step time misses (0: right)."""
    spec = arm == "spec"
    steps, drafts_acc, committed = (7, 24 - 7, 23) if spec else (23, 0, 23)
    step, gap = (60.0 if spec else 15.0) * load, (2.0 if spec else 0.7) * load
    span_ms = steps * step + (steps - 1) * gap  # the long request's first step start to last step end
    accepted = drafts_acc + bonus * steps
    seen = step - step_missed_ms * load
    short = {"steps": 1 if spec else 3, "accepted": 4 if spec else 3, "committed": 3,
             "decode_ms": 2 * seen * (1 if spec else 3), "prefill_ms": 60.0, "prompt_tokens": ctx}
    long_ = {"steps": steps, "accepted": accepted, "committed": committed, "decode_ms": steps * seen,
             "prefill_ms": 90.0, "prompt_tokens": ctx, "decode_tok_s": 1e3 * committed / (steps * seen)}
    n = steps + short["steps"]
    mean_step = (long_["decode_ms"] + short["decode_ms"]) / n
    if spec:
        ph = {"draft": 0.2 * mean_step, "verify": 0.6 * mean_step, "verify_attn": 0.1 * mean_step,
              "verify_moe": 0.2 * mean_step, "verify_rest": 0.3 * mean_step, "draft_extend": 0.15 * mean_step,
              "overhead": 0.05 * mean_step}
    else:
        ph = {"decode": mean_step, "decode_attn": 0.2 * mean_step, "decode_moe": 0.3 * mean_step,
              "decode_rest": 0.5 * mean_step, "overhead": 0.0}
    acc = (long_["accepted"] + short["accepted"]) / n
    return {"schema": "ctxprof-sweep/1", "kind": "two_point", "ctx": ctx, "repeat": rep, "prompt_tokens": ctx,
            "cached_tokens": 0, "decode_tok_s": 1e3 * committed / span_ms, "accept_per_step": acc if spec else None,
            "server_wall_tok_s": 1e3 * committed / span_ms, "server_requests": {"short": short, "long": long_},
            "breakdown": {"steps": n, "mean_batch_size": 1.0, "accepted_per_step": acc,
                          "committed_per_step": 26 / n, "phases_ms": {**ph, "step": mean_step},
                          "server_tok_s": 1e3 * 26 / n / mean_step, "host_gap_ms": gap,
                          "algorithms": ["EAGLE" if spec else "NONE"], "timing": "cpu"}}


def _pair_run(tmp_path, **spec_kw):
    for arm in ("spec", "plain"):
        d = tmp_path / arm
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"arm": arm, "ctx": [64, 2048], "arms": ["spec", "plain"]}))
        for ctx, scale in ((64, 1.0), (2048, 1.5)):
            for rep, load in enumerate((1.0, 3.0, 0.8)):  # a repeat 3x slower: other tenants
                p = _arm_point(arm, ctx, rep, load * scale, **(spec_kw if arm == "spec" else {}))
                (d / f"point-c{ctx:06d}-r{rep:02d}.json").write_text(json.dumps(p))
    return {t["ctx"]: t for t in arms_report(tmp_path)["table"]}


def test_each_pair_the_ledger_predicts_its_own_measured_speedup(tmp_path):
    table = _pair_run(tmp_path)
    for t in table.values():
        assert [a["repeat"] for a in t["pairs"]] == [0, 1, 2]
        for a in t["pairs"]:
            # AL 24/7 x (15 + 0.7) / (60 + 2) against 23 tokens over 7 x 60 + 6 x 2 ms vs 23 over 23 x 15 + 22 x 0.7
            assert a["predicted"] == pytest.approx((24 / 7) * 15.7 / 62.0)
            assert a["measured"] == pytest.approx((23 / 432.0) / (23 / 360.4))
            # the pooled point (the short request's slow step in it) is off by more than the pair's own steps
            assert abs(a["point_predicted"] / a["measured"] - 1) > abs(a["error"])
        assert t["pair_error"] == pytest.approx(abs(a["predicted"] / a["measured"] - 1)) and t["pair_error"] <= 0.10


def test_a_miscounted_bonus_token_breaks_the_pair_agreement(tmp_path):
    table = _pair_run(tmp_path, bonus=0)  # accepted tokens counted without the bonus token
    assert all(t["pair_error"] > 0.10 for t in table.values()), table
    assert all(a["error"] < -0.2 for t in table.values() for a in t["pairs"])


def test_a_step_time_missing_a_phase_breaks_the_pair_agreement(tmp_path):
    table = _pair_run(tmp_path, step_missed_ms=9.0)  # the step's clock misses draft_extend's 9 ms of 60
    assert all(t["pair_error"] > 0.10 for t in table.values()), table


@pytest.mark.parametrize("edit", [
    lambda p: p.update(server_requests={"long": {"steps": 10, "decode_ms": 50.0, "accepted": None}}),
    lambda p: p["breakdown"]["phases_ms"].update(draft=None),
    lambda p: p.update(server_wall_tok_s=float("inf")),
    lambda p: p["breakdown"].update(accepted_per_step=float("nan")),
])
def test_a_hand_edited_arms_point_is_one_line(tmp_path, capsys, edit):
    """A point file edited by hand (a null where a number was, a non-finite number) is refused in one
    line naming the file, or read without it: never a traceback."""
    test_arms_report_from_saved_directories(tmp_path)
    capsys.readouterr()
    f = tmp_path / "spec" / "point-c004000-r00.json"
    p = json.loads(f.read_text())
    edit(p)
    f.write_text(json.dumps(p))
    rc = main(["report", str(tmp_path), "--no-plots"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert rc == 0 or (rc == 2 and "point-c004000-r00.json" in err), err


def _arms_dirs(tmp_path, offset):
    """Both arms at 1000/4000/8000 tokens, speculation paying at each (so the crossover is
    extrapolated with the speculative arm's acceptance); ``offset``: how far past the prompt the
    points' steps ran (their breakdown's ``mean_ctx``; 0: a point saved without it)."""
    steps = {1000: (20.0, 10.0), 4000: (26.0, 11.0), 8000: (32.0, 12.0)}
    for arm in ("spec", "plain"):
        d = tmp_path / arm
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"arm": arm, "ctx": sorted(steps)}))
        for ctx, (s_step, p_step) in steps.items():
            for rep in range(2):
                al = 3.0 if arm == "spec" else 1.0
                step = s_step if arm == "spec" else p_step
                p = _point(arm, ctx, rep, 1e3 * al / (step + 0.1), al, step, 2.0 + ctx / 1e3)
                if offset:
                    p["breakdown"]["mean_ctx"] = ctx + offset
                (d / f"point-c{ctx:06d}-r{rep:02d}.json").write_text(json.dumps(p))
    return arms_report(tmp_path)


def test_points_placed_where_their_steps_ran_keep_the_table_and_crossover(tmp_path):
    """The ledger's rows sit at the points' step contexts (a little past their prompts): the table and
    the extrapolated crossover still find each context's row (by its label), acceptance included."""
    at_prompt, later = _arms_dirs(tmp_path / "a", 0), _arms_dirs(tmp_path / "b", 40)
    assert at_prompt["crossover"]["how"] == later["crossover"]["how"] == "extrapolated"
    assert later["crossover"]["ctx"] == pytest.approx(at_prompt["crossover"]["ctx"] + 40, rel=0.02)
    assert [r["ctx"] for r in later["ledger"]["rows"]] == [1040.0, 4040.0, 8040.0]
