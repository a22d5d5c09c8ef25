"""Sweep by draft budget and with fixed acceptance: argument handling and the budget table."""

from __future__ import annotations

import pytest

from sglang_ctxprof.cli.main import CliError
from sglang_ctxprof.cli.sweep import SweepArgs
from sglang_ctxprof.cli.sweep_budget import budget_table, with_budget
from sglang_ctxprof.cli.sweep_results import footnotes


def test_with_budget_replaces_the_chain_flags():
    a = ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    out = with_budget(a, 8)
    assert out.count("--speculative-num-draft-tokens") == 1 and out[-4:] == [
        "--speculative-num-draft-tokens", "8", "--speculative-num-steps", "7"]
    tree = with_budget(["--speculative-eagle-topk", "4", "--speculative-num-steps", "3"], 8)
    assert tree == ["--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
                    "--speculative-num-draft-tokens", "8"]  # a tree keeps its depth
    assert with_budget(["--speculative-algorithm", "NGRAM"], 6)[-2:] == ["--speculative-num-draft-tokens", "6"]


def test_budget_table_picks_the_best_budget_per_context():
    def row(ctx, tok, srv):
        st = lambda v: {"median": v, "spread": 0, "min": v, "max": v, "n": 1, "second": v}  # noqa: E731
        return {"ctx": ctx, "decode_tok_s": st(tok), "server_tok_s": st(srv), "accept_per_step": st(2.0)}

    t = budget_table({2: [row(64, 100, 110), row(4096, 50, 52)], 8: [row(64, 150, 160), row(4096, 40, 41)]})
    assert [(r["ctx"], r["best"], r["best_by"]) for r in t] == [(64, 8, "server"), (4096, 2, "server")]
    # one budget without the server's figure: every budget is judged by the client's, never a mix
    t = budget_table({2: [row(64, 100, 300)], 8: [dict(row(64, 150, 0), server_tok_s=None)]})
    assert (t[0]["best"], t[0]["best_by"]) == (8, "client")


@pytest.mark.parametrize("kw, msg", [
    ({"draft_tokens": [2, 4]}, "need --launch"),
    ({"fixed_acceptance": 2.0}, "need --launch"),
    ({"launch": True, "server_args": ["--model-path", "m"], "draft_tokens": [1], "out": "x"}, ">= 2"),
    ({"launch": True, "server_args": ["--model-path", "m"], "draft_tokens": [4]}, "needs --out"),
    ({"launch": True, "server_args": ["--model-path", "m"], "fixed_acceptance": 0.5}, ">= 1"),
])
def test_bad_combinations_are_clear_errors(kw, msg):
    with pytest.raises(CliError, match=msg):
        SweepArgs(**kw).validate()


def test_legend_says_what_each_figure_measures():
    rows = [{"ctx": 64, "cached_tokens": 0, "breakdown": True, "sustained": {"decode_tok_s": 1.0}}]
    text = " ".join(footnotes(rows, {}))
    assert "upper bound" not in text and "client's wall clock" in text and "server clock" in text


def test_budget_flags_given_with_an_equals_sign_are_read_and_replaced():
    tree = with_budget(["--speculative-algorithm=EAGLE", "--speculative-eagle-topk=4",
                        "--speculative-num-steps=3", "--speculative-num-draft-tokens=16"], 8)
    assert tree == ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
                    "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8"]
    ngram = with_budget(["--speculative-algorithm=NGRAM", "--speculative-num-draft-tokens=4"], 8)
    assert ngram == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]
