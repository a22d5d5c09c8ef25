"""views/exporters: tail-based export of finished requests read from the aggregator's one request
history, run-time policy, rank and metrics gating; the three sinks sit in the recorder's plain list
after the aggregator, and what they learn from the process arrives in one BindFacts when the profiler
binds (not before)."""

from __future__ import annotations

from dataclasses import replace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fakes
from sglang_ctxprof.model import names
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.config import CtxProfConfig, LogSettings
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.sinks import BindFacts
from sglang_ctxprof.testing.session import fed, instrumented
from sglang_ctxprof.views import exporters
from sglang_ctxprof.views.exporters import Exporters, MetricsSink, RequestSink, StepLogSink
from sglang_ctxprof.views.otel import OtelView
from sglang_ctxprof.views.policy import TracePolicy


def _steps(rid, n, ms, start=0):
    for i in range(n):
        yield StepRecord(step_id=start + i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                         ctx_lens=(50 + i,), accepted=(2,), committed=(2,), finished=(i == n - 1,),
                         draft_tokens=4, step_ms=ms, phases_ms={"draft": ms / 2, "verify": ms / 2},
                         t_start_ns=10**18 + (start + i) * 10**8)


def _sinks(policy, primary=True):
    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    s = fed(lambda facts: Exporters(Bucketing.parse("pow2"), policy, facts=replace(facts, primary=primary),
                                    env={}, otel=OtelView(prov)))
    return s, exp



def _exported(exp):
    return [sp.attributes[names.ATTR_RID] for sp in exp.get_finished_spans() if sp.name == names.SPAN_REQUEST]


def test_tail_based_slow_policy_exports_only_slow_requests_with_all_steps():
    s, exp = _sinks(TracePolicy(mode="slow", slow_tok_s=100, slow_step_ms=0))
    for rec in _steps("fast", 5, 1.0):  # 2 tokens / 1 ms = 2000 tok/s
        s.requests.observe(rec)
    for rec in _steps("slow", 7, 50.0, start=100):  # 40 tok/s
        s.requests.observe(rec)
        assert _exported(exp) == [] or rec.finished[0]  # nothing before the request finishes
    assert _exported(exp) == ["slow"]
    steps = [sp for sp in exp.get_finished_spans() if sp.name == names.SPAN_STEP]
    assert len(steps) == 7
    st = s.status()
    assert st["requests_finished"] == 2 and st["requests_traced"] == 1


def test_runtime_policy_switch_and_off():
    s, exp = _sinks(TracePolicy(mode="off"))
    for rec in _steps("a", 3, 50.0):
        s.requests.observe(rec)
    assert _exported(exp) == [] and s.status()["requests_finished"] == 0  # off and no logs: no tracking
    s.set_policy({"mode": "all"})
    for rec in _steps("b", 3, 1.0, start=10):
        s.requests.observe(rec)
    assert _exported(exp) == ["b"] and s.status()["policy"]["mode"] == "all"


def test_only_the_primary_rank_emits_and_metrics_need_enable_metrics():
    s, exp = _sinks(TracePolicy(mode="all"), primary=False)
    for rec in _steps("a", 3, 1.0):
        s.requests.observe(rec)
        s.metrics.observe(rec)
    assert _exported(exp) == [] and s.metrics.view is None and s.status()["metrics"] is None


def test_a_rid_used_again_before_the_sinks_saw_its_finish_exports_each_use_once():
    """The recorder feeds the aggregator every waiting record before the sinks see the first: a
    client that sends the same rid again at once has its next use prefilled (or finished) in the
    history when the request sink reads the last one.  Each use is exported once, with its numbers."""
    agg, rec, exp, spans = _pipeline()
    step = 0
    for use, (prompt, steps) in enumerate([(50, 1), (70, 2), (90, 3)]):
        step += 10
        rec.submit(StepRecord(step_id=step, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=("same",),
                              ctx_lens=(prompt,), accepted=(0,), committed=(0,), finished=(False,),
                              draft_tokens=0, step_ms=1.0, t_start_ns=10**18 + step * 10**7))
        for rec_ in _steps("same", steps, 2.0, start=step + 1):
            rec.submit(rec_)
    rec.flush()  # the aggregator takes all three uses, then the sinks see the first finish
    roots = [sp.attributes for sp in spans.get_finished_spans() if sp.name == names.SPAN_REQUEST]
    assert sorted((a[names.ATTR_PROMPT_TOKENS], a[names.ATTR_STEPS]) for a in roots) == [(50, 1), (70, 2), (90, 3)]
    assert all(a[names.ATTR_FINISHED] for a in roots)


def test_config_names_the_bad_variable():
    import pytest

    for env, name in (({"SGLANG_CTXPROF_TRACE": "yes"}, "SGLANG_CTXPROF_TRACE"),
                      ({"SGLANG_CTXPROF_LOG": "yaml"}, "SGLANG_CTXPROF_LOG"),
                      ({"SGLANG_CTXPROF_TRACE_MAX_OPEN": "0"}, "SGLANG_CTXPROF_TRACE_MAX_OPEN")):
        with pytest.raises(ValueError, match=name):
            CtxProfConfig.from_env(env)
    CtxProfConfig.from_env({})


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
        assert facts.counts is p.aggregator.counts  # the live metrics read the aggregator's counts of a record
        assert exp.requests.facts is exp.steps.facts is exp.metrics.facts is facts
        for i in range(3):
            p.recorder.submit(_rec(i, fin=i == 2))
        p.recorder.flush()
        end = _rec(2).end_ns  # the stamp of the record that finished it
        assert facts.history("a", False, end)["steps"] == 3  # the aggregator's own history, fed before the sinks
        assert "step_rows" not in facts.history("a", False, end)
        assert len(facts.history("a", True, end)["step_rows"]) == 3 and facts.history("a", True, end + 1) is None
        assert exp.status()["requests_finished"] == 1  # the request sink decided the finished request
        assert facts.dropped() == 0 and facts.degraded() is None
    assert exp.steps.logs._thread is None  # uninstrument stopped the log view's summary thread


def test_an_aborted_request_is_logged_under_any_policy_and_traced_by_it_on_the_primary_only():
    from structlog.testing import LogCapture

    from sglang_ctxprof.model.records import RequestEnd
    from sglang_ctxprof.views.logs import LogView, make_logger

    def run(policy, primary):
        s, exp = _sinks(policy, primary=primary)
        cap, cfg = LogCapture(), LogSettings(fmt="json", summary_s=0)
        s.attach_logs(LogView(cfg, s.requests.current_policy,
                              logger=make_logger(cfg, renderer=cap, file=open("/dev/null", "w"))))
        for rec in _steps("slowpoke", 2, 50.0):
            s.requests.observe(replace(rec, finished=(False,)))  # runs two slow steps, never finishes
        s.requests.end(RequestEnd("never", t_ns=5))
        return exp, [(e["rid"], e["aborted"], e["traced"]) for e in cap.entries
                     if e["event"] == names.EVENT_REQUEST_ABORTED], s

    exp, ev, s = run(TracePolicy(mode="off"), True)
    assert ev == [("never", "queued", False)] and _exported(exp) == []
    exp, ev, s = run(TracePolicy(mode="slow", slow_tok_s=0, slow_step_ms=10), True)
    assert ev == [("never", "queued", False)] and _exported(exp) == []  # no steps: not slow
    assert s.status()["logs"]["emitted"][names.EVENT_REQUEST_ABORTED] == 1
    exp, ev, s = run(TracePolicy(mode="all"), False)
    assert ev == [] and _exported(exp) == []  # only the primary rank emits


def test_a_finished_requests_rows_are_read_only_while_it_may_become_a_trace():
    """Policy ``off`` with logs on: the request sink judges and logs a finished request from its
    totals (its slowest step included) and asks the history for no step rows; once the policy may
    export, it asks for them, and the trace carries every step."""
    from structlog.testing import LogCapture

    from sglang_ctxprof.views.logs import LogView, make_logger

    s, exp = _sinks(TracePolicy(mode="off", slow_tok_s=0, slow_step_ms=10))
    asked: list = []
    facts = s.requests.facts
    history = facts.history

    def spy(rid, with_steps, stamp):
        asked.append(with_steps)
        return history(rid, with_steps, stamp)

    s.requests.facts = replace(facts, history=spy)
    cap, cfg = LogCapture(), LogSettings(fmt="json", summary_s=0)
    s.attach_logs(LogView(cfg, s.requests.current_policy,
                          logger=make_logger(cfg, renderer=cap, file=open("/dev/null", "w"))))
    for rec in _steps("a", 3, 50.0):
        s.requests.observe(rec)
    slow = [e for e in cap.entries if e["event"] == names.EVENT_SLOW_REQUEST]
    assert asked == [False] and _exported(exp) == []
    assert [(e["rid"], e["max_step_ms"], e["steps"]) for e in slow] == [("a", 50.0, 3)]
    s.set_policy({"mode": "slow"})
    for rec in _steps("b", 3, 50.0, start=10):
        s.requests.observe(rec)
    assert asked == [False, True] and _exported(exp) == ["b"]
    assert len([sp for sp in exp.get_finished_spans() if sp.name == names.SPAN_STEP]) == 3


def test_a_policy_switch_while_a_request_is_read_applies_from_the_next_one():
    """The control channel may switch the policy while the sink reads a finished request: the
    request is decided under the policy its rows were read for (no trace without its steps), the
    next one under the new policy."""
    from structlog.testing import LogCapture

    from sglang_ctxprof.views.logs import LogView, make_logger

    s, exp = _sinks(TracePolicy(mode="off"))
    cfg = LogSettings(fmt="json", summary_s=0)
    s.attach_logs(LogView(cfg, s.requests.current_policy,
                          logger=make_logger(cfg, renderer=LogCapture(), file=open("/dev/null", "w"))))
    facts = s.requests.facts
    history = facts.history

    def switching(rid, with_steps, stamp):
        req = history(rid, with_steps, stamp)
        s.set_policy({"mode": "all"})  # arrives after the rows were (not) read
        return req

    s.requests.facts = replace(facts, history=switching)
    for rec in _steps("a", 3, 5.0):
        s.requests.observe(rec)
    assert _exported(exp) == [] and s.status()["requests_finished"] == 1
    for rec in _steps("b", 3, 5.0, start=10):
        s.requests.observe(rec)
    assert _exported(exp) == ["b"]
    assert len([sp for sp in exp.get_finished_spans() if sp.name == names.SPAN_STEP]) == 3


def test_a_log_destination_that_breaks_turns_off_the_logs_not_the_traces(tmp_path):
    """The request sink writes its request events to the log view: a failed write is the ``logs``
    component's fault, and the next requests are still traced."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.collect.recorder import Recorder
    from sglang_ctxprof.model.guard import Guard
    from sglang_ctxprof.views.logs import LogView, make_logger

    agg, guard = Aggregator(), Guard()
    mem, prov = InMemorySpanExporter(), TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(mem))
    facts = BindFacts(history=lambda rid, ws, st: agg.finished_request(rid, st, lazy=True, with_steps=ws),
                      guarded=guard.run)
    slow = TracePolicy(mode="slow", slow_tok_s=100, slow_step_ms=0)  # every request slow: each one logged
    exp = Exporters(Bucketing.parse("pow2"), slow, facts=facts, env={}, otel=OtelView(prov))
    out = open(tmp_path / "events.log", "w")
    cfg = LogSettings(fmt="json", summary_s=0)
    exp.attach_logs(LogView(cfg, exp.requests.current_policy, logger=make_logger(cfg, file=out)))
    rec = Recorder(agg, guard, sinks=exp.sinks)
    for k, rid in enumerate("abc"):
        for r in _steps(rid, 3, 50.0, start=10 * k):
            rec.submit(r)
        rec.flush()
        if rid == "a":
            out.close()  # the log destination breaks (closed, full, a broken pipe)
    rec.close()
    assert _exported(mem) == ["a", "b", "c"]
    assert set((guard.status() or {}).get("components", {})) == {"logs"}


def _pipeline():
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.collect.recorder import Recorder
    from sglang_ctxprof.model.guard import Guard

    agg = Aggregator(Bucketing.parse("pow2"))
    spans = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(spans))
    exp = Exporters(Bucketing.parse("pow2"), TracePolicy(mode="all"), env={}, otel=OtelView(prov), facts=BindFacts(
        history=lambda rid, with_steps, stamp: agg.finished_request(rid, stamp, lazy=True, with_steps=with_steps)))
    return agg, Recorder(agg, Guard(), sinks=exp.sinks), exp, spans


def _prefill_of(rid, step, prompt):
    return StepRecord(step_id=step, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                      ctx_lens=(prompt,), accepted=(0,), committed=(0,), finished=(False,),
                      draft_tokens=0, step_ms=1.0, t_start_ns=10**18 + step * 10**7)


def test_a_rid_used_again_after_a_reset_is_exported_with_its_own_numbers():
    """A reset starts the history's use counts again: the sinks tell two uses of a rid apart by the
    stamp of the step (or end) that finished each, so the second is exported, and an aborted one
    with its own steps and prompt."""
    from sglang_ctxprof.model.records import RequestEnd

    agg, rec, exp, spans = _pipeline()
    rec.submit(_prefill_of("job", 1, 50))
    for r in _steps("job", 2, 2.0, start=2):
        rec.submit(r)
    rec.flush()
    rec.with_aggregator(lambda a: a.reset())
    rec.submit(_prefill_of("job", 10, 70))
    for r in _steps("job", 3, 2.0, start=11):
        rec.submit(r)
    rec.flush()
    rec.with_aggregator(lambda a: a.reset())
    rec.submit(_prefill_of("job", 20, 4000))
    rec.submit(RequestEnd("job", retracted=False, t_ns=10**18 + 30 * 10**8))
    rec.flush()
    roots = [sp.attributes for sp in spans.get_finished_spans() if sp.name == names.SPAN_REQUEST]
    assert [(a[names.ATTR_PROMPT_TOKENS], a[names.ATTR_STEPS]) for a in roots] == [(50, 2), (70, 3), (4000, 0)]
    assert exp.status()["requests_finished"] == 3


def test_a_request_aborted_before_its_first_token_has_none():
    """Aborted between two chunks of its prompt (``queued``): no token reached its client, as
    SGLang's ``completion_tokens`` 0 says; one aborted between two chunks of a re-prefill (also
    ``queued``) had its tokens."""
    from sglang_ctxprof.model.records import RequestEnd

    agg, rec, exp, spans = _pipeline()
    rec.submit(_prefill_of("cut", 1, 512))
    rec.submit(RequestEnd("cut", retracted=False, t_ns=10**18 + 5 * 10**7))
    rec.flush()
    (root,) = [sp.attributes for sp in spans.get_finished_spans() if sp.name == names.SPAN_REQUEST]
    assert root[names.ATTR_OUTPUT_TOKENS] == 0 and root[names.ATTR_ABORTED] == names.ABORT_QUEUED
    rec.submit(_prefill_of("back", 10, 100))
    for r in _steps("back", 2, 2.0, start=11):
        rec.submit(replace(r, finished=(False,)))
    rec.submit(replace(_prefill_of("back", 20, 104), prompt_lens=(100,), retractions=(1,)))  # a chunk
    rec.submit(RequestEnd("back", retracted=False, t_ns=10**18 + 30 * 10**8))
    rec.flush()
    back = [sp.attributes for sp in spans.get_finished_spans()
            if sp.name == names.SPAN_REQUEST and sp.attributes[names.ATTR_RID] == "back"]
    assert [a[names.ATTR_OUTPUT_TOKENS] for a in back if a.get(names.ATTR_ABORTED)] == [1 + 4]


def test_a_request_the_span_queue_could_not_take_is_not_counted_as_traced():
    s, exp = _sinks(TracePolicy(mode="all"))
    s.requests.otel.stats.admit = lambda n: False  # the span queue is full: the request is dropped whole
    for r in _steps("r1", 3, 2.0):
        s.requests.observe(r)
    assert _exported(exp) == [] and s.status()["requests_traced"] == 0
    assert s.status()["requests_finished"] == 1


def test_a_request_that_ran_while_profiling_was_off_is_exported_as_partial():
    """Its history missed steps: the summary and the root span say ``partial``, and the span
    claims no output token count (a lower bound would read as SGLang's)."""
    agg, rec, exp, spans = _pipeline()
    rec.submit(_prefill_of("r", 1, 100))
    for r in _steps("r", 2, 2.0, start=2):
        rec.submit(replace(r, finished=(False,)))
    rec.with_aggregator(lambda a: a.interrupt())  # switched off, steps ran unseen, back on
    for r in _steps("r", 2, 2.0, start=8):
        rec.submit(r)
    rec.flush()
    (root,) = [sp.attributes for sp in spans.get_finished_spans() if sp.name == names.SPAN_REQUEST]
    assert root[names.ATTR_PARTIAL] is True and names.ATTR_OUTPUT_TOKENS not in root
    assert root[names.ATTR_PROMPT_TOKENS] == 100 and agg.requests.get("r")["partial"] is True
