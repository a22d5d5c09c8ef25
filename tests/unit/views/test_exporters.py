"""views/exporters: the three sinks sit in the recorder's plain list after the aggregator, and what
they learn from the process arrives in one BindFacts when the profiler binds (not before)."""

from __future__ import annotations

import fakes
from sglang_ctxprof.model.config import CtxProfConfig, LogSettings
from sglang_ctxprof.model.sinks import BindFacts
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.testing.session import instrumented
from sglang_ctxprof.views import exporters
from sglang_ctxprof.views.exporters import MetricsSink, RequestSink, StepLogSink


def _rec(i, fin=False):
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(100,),
                      accepted=(2,), committed=(2,), finished=(fin,), draft_tokens=4, step_ms=1.0,
                      phases_ms={"draft": 0.5, "verify": 0.5}, t_start_ns=10**18 + i)


def test_sinks_are_registered_in_order_and_get_their_facts_at_bind():
    cfg = CtxProfConfig(logs=LogSettings(fmt="json"))
    with instrumented([], cfg, exporters=exporters.install) as session:
        p = session.profiler
        exp = p.exporters
        assert [type(s) for s in p.recorder.sinks[-3:]] == [RequestSink, StepLogSink, MetricsSink]
        assert [s.name for s in exp.sinks] == ["exporter", "logs", "metrics"]
        assert all(s.facts == BindFacts() for s in (exp.requests, exp.steps, exp.metrics))  # not bound yet
        p.bind(fakes.Scheduler(fakes.Worker()))
        facts = exp.facts
        assert facts.primary and facts.metrics_enabled is False
        assert exp.requests.facts is exp.steps.facts is exp.metrics.facts is facts
        for i in range(3):
            p.recorder.submit(_rec(i, fin=i == 2))
        p.recorder.flush()
        assert facts.history("a")["steps"] == 3  # the aggregator's own history, fed before the sinks
        assert exp.status()["requests_finished"] == 1  # the request sink decided the finished request
        assert facts.dropped() == 0 and facts.degraded() is None
    assert exp.steps.logs._thread is None  # uninstrument stopped the log view's summary thread
