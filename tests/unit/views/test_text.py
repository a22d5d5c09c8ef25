"""views/text: the text table's phase columns are the phases that add up to the step."""

from __future__ import annotations


def test_the_text_table_shows_a_forward_that_ran_whole():
    """Steps whose verify ran whole in a CUDA graph (no split read): the table's phase columns add up
    to the step, as the page's and records.leaf_phases; a forward is never shown with its parts."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.model.records import RankId, StepRecord
    from sglang_ctxprof.views.profile import build_profile
    from sglang_ctxprof.views.text import render

    agg, t = Aggregator(), 1_700_000_000 * 10**9
    for k in range(8):
        ph = {"draft": 3.0, "verify": 8.0, "draft_extend": 1.0, "overhead": 0.5}
        agg.observe(StepRecord(k + 1, "decode", "EAGLE", RankId(), ("r",), (4000 + k,), (3,), (3,), (False,), 4,
                               12.5, ph, t_start_ns=t, timing="cuda_graph", t_end_ns=t + 12_500_000,
                               exec_mode="graph", attn_backend="fa3", draft_depth=3))
        t += 12_600_000
    lines = render(build_profile(agg.snapshot())).splitlines()
    head = next(ln for ln in lines if ln.lstrip().startswith("ctx"))
    assert "verify ms" in head and "v.attn" not in head
    row = next(ln for ln in lines if ln.lstrip().startswith("2048-4095"))
    assert "8.00" in row.split()
