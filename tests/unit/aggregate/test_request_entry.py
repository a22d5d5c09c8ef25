"""aggregate/request_entry: one request's entry, its finish stamp, its summary."""

from __future__ import annotations

from sglang_ctxprof.aggregate.request_entry import (INTERNAL, aborted_summary, finish, new_entry, summarize,
                                                    tok_s)
from sglang_ctxprof.model.records import RequestEnd


def test_a_finish_is_stamped_once():
    r = new_entry("r", 5)
    assert not r["finished"] and r["finished_at"] == 0
    finish(r, 17)
    finish(r, 23)  # a later record repeating the finish
    assert r["finished"] and r["finished_at"] == 17


def test_a_summary_hides_the_bookkeeping_and_adds_the_rates():
    r = new_entry("r", 5)
    r.update(steps=4, accepted=10, committed=8, decode_ms=40.0)
    out = summarize(r, with_steps=True)
    assert not set(INTERNAL) - {"step_rows"} & set(out) and out["step_rows"] == []
    assert out["accepted_per_step"] == 2.5 and out["decode_tok_s"] == tok_s(r) == 200.0
    assert "step_rows" not in summarize(r, with_steps=False)


def test_an_abort_before_the_first_step_is_a_finished_request_of_no_steps():
    out = aborted_summary(RequestEnd("q", retracted=False, t_ns=9))
    assert (out["rid"], out["finished"], out["aborted"], out["steps"], out["t_end_ns"]) == ("q", True, "queued", 0, 9)
    assert tok_s(out) == 0.0
