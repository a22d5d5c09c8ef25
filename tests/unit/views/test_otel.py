"""views/otel.py: span tree, sequential phase layout, trace-context parenting and counted drops."""

from __future__ import annotations

import logging
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_ctxprof.model import names
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.aggregate.requests import RequestLog
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.views.otel import OtelView, build_provider

T0 = 1_700_000_000_000_000_000
PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}


def _rec(step_id, kind, ctx, fin=False, t=T0, tp=()):
    return StepRecord(step_id=step_id, kind=kind, algorithm="EAGLE", rank=RankId(), rids=("r1",),
                      ctx_lens=(ctx,), accepted=(3,) if kind == "decode" else (0,),
                      committed=(3,) if kind == "decode" else (0,), finished=(fin,), draft_tokens=4,
                      step_ms=5.0 if kind == "decode" else 20.0, phases_ms=PH if kind == "decode" else {},
                      t_start_ns=t, trace_parents=tp)


def _request(n_steps=3, tp=()):
    log = RequestLog()
    log.observe(_rec(0, "prefill", 100, t=T0, tp=tp))
    for i in range(n_steps):
        log.observe(_rec(i + 1, "decode", 101 + 3 * i, fin=i == n_steps - 1, t=T0 + (30 + 10 * i) * 10**6))
    return log.get("r1")


def _view():
    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    return OtelView(prov, bucket_label=lambda c: "64-127"), exp


def test_span_tree_and_attributes():
    view, exp = _view()
    view.export_request(_request(), slow_reason="decode_tok_s 1 < 20")
    spans = exp.get_finished_spans()
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (root,) = by_name[names.SPAN_REQUEST]
    assert root.parent is None
    a = root.attributes
    assert a[names.ATTR_RID] == "r1" and a[names.ATTR_PROMPT_TOKENS] == 100
    assert a[names.ATTR_OUTPUT_TOKENS] == 1 + 9 and a[names.ATTR_ACCEPT_MEAN] == 3.0
    assert a[names.ATTR_DECODE_TOK_S] == pytest.approx(9 / 0.015)
    assert a[names.ATTR_SLOW_REASON].startswith("decode_tok_s")
    assert root.start_time == T0 and root.end_time == T0 + 50 * 10**6 + 5 * 10**6
    steps = by_name[names.SPAN_STEP]
    assert len(steps) == 3 and all(s.parent.span_id == root.context.span_id for s in steps)
    assert [s.attributes[names.ATTR_CTX_LEN] for s in steps] == [101, 104, 107]
    for s in steps:
        assert s.attributes[names.ATTR_BATCH_SIZE] == 1 and s.attributes[names.ATTR_DRAFT_TOKENS] == 4
        assert s.attributes[names.ATTR_ACCEPTED] == 3 and s.attributes[names.ATTR_CTX_BUCKET] == "64-127"
        assert s.end_time - s.start_time == 5 * 10**6
        kids = sorted((k for k in spans if k.parent and k.parent.span_id == s.context.span_id),
                      key=lambda k: k.start_time)
        assert [k.name for k in kids] == ["ctxprof.draft", "ctxprof.verify", "ctxprof.draft_extend",
                                          "ctxprof.overhead"]
        # sequential layout: back to back from the step start, ending exactly at the step end
        assert kids[0].start_time == s.start_time and kids[-1].end_time == s.end_time
        for x, y in zip(kids, kids[1:]):
            assert x.end_time == y.start_time
        verify = kids[1]
        vk = sorted((k for k in spans if k.parent and k.parent.span_id == verify.context.span_id),
                    key=lambda k: k.start_time)
        assert [k.name for k in vk] == ["ctxprof.verify_attn", "ctxprof.verify_moe", "ctxprof.verify_rest"]
        assert vk[0].start_time == verify.start_time and vk[-1].end_time == verify.end_time
        assert [k.attributes[names.ATTR_PHASE] for k in vk] == ["verify_attn", "verify_moe", "verify_rest"]
    (pre,) = by_name[names.SPAN_PREFILL]
    assert pre.end_time - pre.start_time == 20 * 10**6
    assert len({s.context.trace_id for s in spans}) == 1


def test_traceparent_joins_the_callers_trace():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    view, exp = _view()
    view.export_request(_request(2, tp=(tp,)))
    spans = exp.get_finished_spans()
    root = next(s for s in spans if s.name == names.SPAN_REQUEST)
    assert root.parent.span_id == 0x00F067AA0BA902B7
    assert {s.context.trace_id for s in spans} == {0x4BF92F3577B34DA6A3CE929D0E0E4736}


class _Blocking(SpanExporter):
    def __init__(self):
        self.release = threading.Event()
        self.got = 0

    def export(self, spans):
        self.release.wait(10)
        self.got += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


class _Down(SpanExporter):
    def export(self, spans):
        raise ConnectionRefusedError("collector down")

    def shutdown(self):
        pass


def test_bounded_queue_counts_drops_and_never_blocks():
    exp = _Blocking()
    queue = CtxProfConfig.from_env({"SGLANG_CTXPROF_OTEL_QUEUE": "4"}).export.otel_queue
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=queue)
    view = OtelView(prov, stats)
    view.export_request(_request(3))  # 1 + 1 + 3 * 8 = 26 spans, or 5 a span a step: never fit a queue of 4
    for _ in range(3):  # a root and its prefill each, the exporter stuck: the queue fills, nothing blocks
        view.export_request(_request(0))
    d = stats.to_dict()
    assert d["requests_dropped"] >= 1 and d["requests_exported"] + d["requests_dropped"] == 4
    exp.release.set()
    view.flush()
    d = stats.to_dict()
    assert d["spans_exported"] == exp.got and d["requests_compact"] == 0
    assert d["spans_exported"] + d["spans_dropped"] == 5 + 2 + 2 + 2  # every request whole, one way or the other
    view.shutdown()


def test_collector_down_counts_every_span_as_dropped():
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=_Down())
    view = OtelView(prov, stats)
    view.export_request(_request(2))
    view.flush()
    d = stats.to_dict()
    assert d["spans_exported"] == 0 and d["spans_dropped"] == 1 + 1 + 2 * 8 and d["failed_batches"] >= 1
    assert d["requests_exported"] == 1
    view.shutdown()


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="SGLANG_CTXPROF_OTEL_QUEUE"):
        CtxProfConfig.from_env({"SGLANG_CTXPROF_OTEL_QUEUE": "many"})
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE"):
        CtxProfConfig.from_env({"OTEL_BSP_MAX_QUEUE_SIZE": "0"})
    assert CtxProfConfig.from_env({"OTEL_BSP_MAX_QUEUE_SIZE": "7"}).export.otel_queue == 7
    with pytest.raises(ValueError, match="not supported"):
        build_provider({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "carrier-pigeon"})


class _LoudDown(SpanExporter):
    def export(self, spans):
        logging.getLogger("opentelemetry.exporter.otlp.common.http").error("Failed to export span batch")
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


def test_down_collector_costs_one_warning_not_a_line_per_batch(caplog):
    caplog.set_level(logging.WARNING)
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=_LoudDown())
    view = OtelView(prov, stats)
    for _ in range(3):
        view.export_request(_request(2))
        view.flush()
    msgs = [r.getMessage() for r in caplog.records]
    assert not any("Failed to export span batch" in m for m in msgs)
    assert sum("OTLP span export failed" in m for m in msgs) == 1
    assert stats.to_dict()["failed_batches"] >= 3
    # the same OTel logger, from any other thread (e.g. SGLang's own exporter), is untouched
    t = threading.Thread(target=lambda: logging.getLogger("opentelemetry.exporter.otlp.common.http").error("theirs"))
    t.start()
    t.join()
    assert "theirs" in [r.getMessage() for r in caplog.records]
    view.shutdown()


def test_verify_children_tile_verify_exactly_with_awkward_floats():
    view, exp = _view()
    req = _request(1)
    req["step_rows"][0]["phases_ms"] = {"draft": 1.1111111, "verify": 2.2222223, "verify_attn": 0.7777777,
                                        "verify_moe": 0.3333333, "verify_rest": 1.1111113, "draft_extend": 0.3}
    view.export_request(req)
    spans = exp.get_finished_spans()
    verify = next(s for s in spans if s.name == "ctxprof.verify")
    kids = sorted((s for s in spans if s.parent and s.parent.span_id == verify.context.span_id),
                  key=lambda s: s.start_time)
    assert kids[0].start_time == verify.start_time and kids[-1].end_time == verify.end_time
    assert all(a.end_time == b.start_time for a, b in zip(kids, kids[1:]))


class _Hung(SpanExporter):
    """A collector that never answers (its export returns only once the test lets it)."""

    def __init__(self):
        self.release = threading.Event()
        self.returned = threading.Event()

    def export(self, spans):
        self.release.wait(60)
        self.returned.set()
        return SpanExportResult.FAILURE

    def shutdown(self):
        return None


def test_shutdown_with_a_hung_collector_is_bounded_and_counts_what_it_leaves():
    """Tearing the exporters down waits a few seconds at most, and the spans it leaves behind (in
    the queue, or in an export that never returned) are counted dropped: exported + dropped still
    equals every span ended."""
    hung = _Hung()  # its export waits for release (up to a minute): shutdown must not wait for it
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=hung, queue=64)
    view = OtelView(prov, stats)
    for _ in range(3):
        view.export_request(_request(3))  # 26 spans each: in the queue, or handed to the hung export
    view.shutdown(timeout_s=0.5)
    d = stats.to_dict()
    assert not hung.release.is_set()  # shut down while the export still hangs
    hung.release.set()  # the export returns after the count was closed: counted once, not again
    assert hung.returned.wait(60)
    for t in threading.enumerate():  # the provider's shutdown, left running, ends once every export returned
        if t.name == "ctxprof-otel-shutdown":
            t.join(60)
    assert d["spans_exported"] + d["spans_dropped"] == 3 * 26 == stats.to_dict()["spans_dropped"]


@pytest.mark.parametrize("env,want", [({}, "sglang"), ({"OTEL_SERVICE_NAME": "shop"}, "shop"),
                                      ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.name=shop"},
                                       "shop"),
                                      ({"OTEL_RESOURCE_ATTRIBUTES": "service.namespace=x"}, "sglang")])
def test_the_service_name_is_the_operators_wherever_they_set_it(monkeypatch, env, want):
    """``OTEL_SERVICE_NAME`` or a ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` (the SDK reads both);
    ``sglang`` only where neither names the service."""
    for key in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    prov, _ = build_provider(dict(env), exporter=_Blocking())
    try:
        assert prov.resource.attributes["service.name"] == want
    finally:
        prov.shutdown()


def test_the_root_counts_every_step_without_a_span_as_the_trace_export_does():
    """Steps past the request's row budget and rows shed for the history's global budget both have
    no step span: the root's ``ctxprof.steps_truncated`` counts both (``trace.json``'s
    ``step_rows_not_kept``)."""
    from sglang_ctxprof.views.trace_events import request_trace

    log = RequestLog(max_steps=8, max_rows=2)  # 2 rows in all: this request's are shed
    log.observe(_rec(0, "prefill", 100))
    for i in range(4):
        log.observe(_rec(i + 1, "decode", 101 + 3 * i, fin=i == 3, t=T0 + (30 + 10 * i) * 10**6))
    req = log.get("r1")
    assert req["steps"] == 4 and req["step_rows_dropped"] == 3
    view, exp = _view()
    view.export_request(req)
    (root,) = [s for s in exp.get_finished_spans() if s.name == names.SPAN_REQUEST]
    steps = [s for s in exp.get_finished_spans() if s.name == names.SPAN_STEP]
    assert root.attributes[names.ATTR_STEPS_TRUNCATED] == 4 - len(steps)
    assert request_trace(req)["otherData"]["step_rows_not_kept"] == 4 - len(steps)


def test_a_rid_no_utf8_carries_is_exported_escaped():
    """SGLang (pickle IPC) takes a rid with a lone surrogate (a JSON ``\\ud800`` escape): the OTLP
    encoder would drop the attribute with a traceback in the server's log for each span; it goes out
    with the surrogate written as an escape instead."""
    from dataclasses import replace

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    view, exp = _view()
    log = RequestLog()
    for rec in (_rec(0, "prefill", 100), _rec(1, "decode", 101, fin=True, t=T0 + 30 * 10**6)):
        log.observe(replace(rec, rids=("ab\ud800c",)))
    view.export_request(log.get("ab\ud800c"))
    spans = exp.get_finished_spans()
    root = next(s for s in spans if s.name == names.SPAN_REQUEST)
    assert root.attributes[names.ATTR_RID] == "ab\\ud800c"
    encode_spans(spans).SerializeToString()  # every attribute encodes
