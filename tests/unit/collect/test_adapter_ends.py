"""A request SGLang aborts while it waits ends in the history (``adapter_ends``, ``hooks.request_end``).

Through a real session on the fake scheduler: the hook on ``send_abort_output`` reaches the history
through the recorder, in order with the steps; a request retracted and then aborted, and one aborted
before its first step (counted only), both end; a failure of ours never fails SGLang's call.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import fakes
from fakes import Batch, Req
from sglang_ctxprof.collect import adapter, hooks
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.session import CtxProfSession
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.model.records import RequestEnd
from sglang_ctxprof.views.profile import build_profile

M = fakes.__name__
TARGETS = [Target(f"{M}.Scheduler.{p}", h) for p, h in (
    ("run_batch", "run_batch"), ("process_batch_result", "process_batch_result"),
    ("send_abort_output", "request_end"))]


def _session():
    s = CtxProfSession(CtxProfConfig(), targets=TARGETS)
    assert set(s.instrument().values()) == {"ok"}
    return s


def test_the_adapter_hooks_send_abort_output():
    ends = [t for t in adapter.TARGETS if t.hook == "request_end"]
    assert [t.path for t in ends] == ["sglang.srt.managers.scheduler.Scheduler.send_abort_output"]
    assert ends[0].group == "timing" and not ends[0].required
    assert adapter.SIGNATURES[ends[0].path] == ("self", "abort_req", "req")


def test_ended_request_reads_rid_and_retraction():
    req = SimpleNamespace(rid="x" * 300, is_retracted=True)
    end = adapter.ended_request(req)
    assert end.retracted is True and end.rid == adapter.req_ids((SimpleNamespace(rid=req.rid, origin_input_ids=[]),))[0][0]
    t0 = time.time_ns()
    q = adapter.ended_request(SimpleNamespace(rid="q"))
    assert (q.rid, q.retracted, q.kind) == ("q", False, "queued") and t0 <= q.t_ns <= time.time_ns()


def test_retracted_then_aborted_and_aborted_before_any_step_both_end():
    s = _session()
    try:
        p = s.profiler
        sched = fakes.Scheduler(fakes.Worker())
        a, b = Req("a", 40), Req("b", 60)
        sched.process_batch_result(Batch([a, b], "EXTEND"), sched.run_batch(Batch([a, b], "EXTEND")))
        for _ in range(2):
            batch = Batch([a, b])
            sched.process_batch_result(batch, sched.run_batch(batch))
        a.is_retracted = True  # SGLang retracted it; it waits to be prefilled again, then is aborted
        sched.send_abort_output(None, a)
        sched.send_abort_output(None, SimpleNamespace(rid="never-ran", is_retracted=False))
        assert sched.aborted_outputs == 2  # SGLang's own call ran, once each
        p.recorder.flush()
        agg = p.aggregator
        ra, rb = agg.request("a"), agg.request("b")
        assert ra["finished"] is True and ra["aborted"] == "retracted" and ra["steps"] == 2
        assert rb["finished"] is False and rb["aborted"] == ""
        assert agg.request("never-ran") is None
        snap = agg.snapshot()
        assert snap.requests_aborted == 2 and build_profile(snap).totals.requests_aborted == 2
    finally:
        s.uninstrument()


def test_a_failure_of_ours_never_fails_the_abort(monkeypatch):
    s = _session()
    try:
        def boom(req):
            raise RuntimeError("adapter broke")
        monkeypatch.setattr(adapter, "ended_request", boom)
        sched = fakes.Scheduler(fakes.Worker())
        sched.send_abort_output(None, Req("z", 5))
        assert sched.aborted_outputs == 1 and not s.profiler.guard.ok("hooks")
    finally:
        s.uninstrument()


def test_off_records_nothing():
    s = _session()
    try:
        s.disable()
        sched = fakes.Scheduler(fakes.Worker())
        sched.send_abort_output(None, Req("z", 5))
        assert hooks.SESSION is s and s.profiler.aggregator.snapshot().requests_aborted == 0
    finally:
        s.uninstrument()


def test_a_decode_step_dp_attention_runs_as_an_extend_is_a_decode_step():
    """``convert_decode_to_extend`` (a DP peer prefills): EXTEND mode, ``decoding_reqs`` the batch's
    own list.  A mixed batch (``mix_with_running``: the running batch's list) stays a prefill."""
    from fakes import Batch, Req
    from sglang_ctxprof.collect.adapter import batch_kind

    reqs = [Req("a", 10), Req("b", 20)]
    converted = Batch(reqs, mode="EXTEND")
    converted.decoding_reqs = converted.reqs
    mixed = Batch([Req("c", 300)] + reqs, mode="EXTEND")
    mixed.decoding_reqs = reqs
    assert batch_kind(converted) == "decode" and batch_kind(mixed) == "prefill"
    assert batch_kind(Batch(reqs, mode="EXTEND")) == "prefill" and batch_kind(Batch(reqs)) == "decode"
