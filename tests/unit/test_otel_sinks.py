"""views/exporters: tail-based export of finished requests read from the aggregator's one request
history, run-time policy, rank and metrics gating."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_ctxprof.model import names
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.testing.session import fed
from dataclasses import replace

from sglang_ctxprof.views.exporters import Exporters
from sglang_ctxprof.views.policy import TracePolicy
from sglang_ctxprof.views.otel import OtelView


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


def test_config_names_the_bad_variable():
    import pytest

    for env, name in (({"SGLANG_CTXPROF_TRACE": "yes"}, "SGLANG_CTXPROF_TRACE"),
                      ({"SGLANG_CTXPROF_LOG": "yaml"}, "SGLANG_CTXPROF_LOG"),
                      ({"SGLANG_CTXPROF_TRACE_MAX_OPEN": "0"}, "SGLANG_CTXPROF_TRACE_MAX_OPEN")):
        with pytest.raises(ValueError, match=name):
            CtxProfConfig.from_env(env)
    CtxProfConfig.from_env({})
