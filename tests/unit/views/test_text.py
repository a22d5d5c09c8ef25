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


def test_a_rank_that_has_not_timed_a_step_gives_no_cost_line_and_no_failure():
    """A sampled step whose scheduler time is counted but whose step time is not (a GPU step still
    parked, an overlap step that made no record): its shares are None; the text says nothing of it
    instead of failing the route (three failures would switch every route off)."""
    from sglang_ctxprof.collect.cost import Cost
    from sglang_ctxprof.views.text import cost_line

    untimed = Cost()
    untimed.add_sched(40_000)
    timed = Cost()
    timed.add_sched(40_000)
    timed.add_step(20.0, None)
    assert untimed.to_dict()["sampled_steps"] == 1 and untimed.to_dict()["step_share"] is None
    assert cost_line([{"status": {"cost": untimed.to_dict()}}]) == ""
    line = cost_line([{"status": {"cost": untimed.to_dict()}}, {"status": {"cost": timed.to_dict()}}])
    assert line.startswith("profiler cost: 0.2% of the step")
