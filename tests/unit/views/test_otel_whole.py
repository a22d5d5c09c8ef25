"""views/otel.py under span-queue overflow: a traced request is exported whole or dropped whole.

Spans reach the queue as they end, and a request's root span ends last: a queue that overflows in
the middle of a long request used to keep its steps and drop its root, leaving orphans no trace
view can show.  Now a request whose spans do not fit in the room left is dropped whole, and counted.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from sglang_ctxprof.aggregate.requests import RequestLog
from sglang_ctxprof.model import names
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.otel import OtelView, build_provider

T0 = 1_700_000_000_000_000_000
PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}
SPANS_PER_STEP = 8  # step, draft, verify (attn, moe, rest), draft_extend, overhead


def _request(rid: str, n_steps: int) -> dict:
    log = RequestLog()

    def rec(i: int, kind: str, fin: bool = False) -> StepRecord:
        dec = kind == "decode"
        return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(rid,),
                          ctx_lens=(100 + i,), accepted=(3 if dec else 0,), committed=(3 if dec else 0,),
                          finished=(fin,), draft_tokens=4, step_ms=5.0 if dec else 20.0,
                          phases_ms=PH if dec else {}, t_start_ns=T0 + i * 10**7)

    log.observe(rec(0, "prefill"))
    for i in range(n_steps):
        log.observe(rec(i + 1, "decode", fin=i == n_steps - 1))
    return log.get(rid)


class _Recording(SpanExporter):
    """Holds every batch until released, then keeps the spans."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans: list = []

    def export(self, spans):
        self.release.wait(10)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


def _by_trace(spans) -> dict:
    out = defaultdict(list)
    for s in spans:
        out[s.context.trace_id].append(s)
    return out


def test_overflow_keeps_each_request_whole_or_drops_it_whole():
    exp = _Recording()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=64)
    view = OtelView(prov, stats)
    short, long_ = _request("short", 2), _request("long", 6)  # 2 + 2*8 = 18 and 2 + 6*8 = 50 spans
    view.export_request(short)
    view.export_request(long_)  # 46 places left in a queue of 64, exporter stuck
    exp.release.set()
    view.flush()
    traces = _by_trace(exp.spans)
    for spans in traces.values():
        roots = [s for s in spans if s.name == names.SPAN_REQUEST]
        assert len(roots) == 1, f"a trace of {len(spans)} spans lost its root"
        steps = roots[0].attributes[names.ATTR_STEPS]
        assert len(spans) == 2 + SPANS_PER_STEP * steps  # whole: every span of the request
    rids = {s.attributes[names.ATTR_RID] for s in exp.spans if s.name == names.SPAN_REQUEST}
    assert rids == {"short"}
    d = stats.to_dict()
    assert d["requests_exported"] == 1 and d["requests_dropped"] == 1
    assert d["spans_exported"] == 18 and d["spans_dropped"] == 50
    view.shutdown()


@pytest.mark.parametrize("queue, requests, exported", [
    # 5 x 34 spans through a queue of 64: each waits for the queue to drain, then fits whole
    (64, [(f"r{i}", 4) for i in range(5)], {f"r{i}" for i in range(5)}),
    # 20 steps can never fit a queue of 16, not even a span a step (22): dropped whole and counted;
    # the 10-span one still fits
    (16, [("big", 20), ("small", 1)], {"small"}),
], ids=["fits-after-drain", "larger-than-queue"])
def test_a_request_is_exported_whole_once_it_fits_or_dropped_whole(queue, requests, exported):
    exp = _Recording()
    exp.release.set()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=queue)
    view = OtelView(prov, stats)
    for rid, n_steps in requests:
        view.export_request(_request(rid, n_steps))
        view.flush()
    spans = {rid: 2 + SPANS_PER_STEP * n if 2 + SPANS_PER_STEP * n <= queue else 2 + n for rid, n in requests}
    by_rid = {s.attributes[names.ATTR_RID]: len(v) for v in _by_trace(exp.spans).values()
              for s in v if s.name == names.SPAN_REQUEST}
    assert by_rid == {rid: spans[rid] for rid in exported}  # whole: every span of each exported one
    d = stats.to_dict()
    assert d["requests_exported"] == len(exported) and d["requests_dropped"] == len(requests) - len(exported)
    assert d["spans_exported"] == sum(spans[r] for r in exported) == len(exp.spans)
    assert d["spans_dropped"] == sum(n for r, n in spans.items() if r not in exported)
    view.shutdown()


def test_aborted_requests_are_kept_whole_or_dropped_whole_too():
    """A request aborted after its steps (too big for the queue, even a span a step) is dropped whole
    and counted; one aborted before its first step is one root span, which fits."""
    from sglang_ctxprof.aggregate.request_entry import aborted_summary
    from sglang_ctxprof.model.records import RequestEnd

    exp = _Recording()
    exp.release.set()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=16)
    view = OtelView(prov, stats)
    log = RequestLog()
    for i in range(21):  # prefill + 20 decode steps = 162 spans (22 a span a step), never finished by a step
        dec = i > 0
        log.observe(StepRecord(step_id=i, kind="decode" if dec else "prefill", algorithm="EAGLE", rank=RankId(),
                               rids=("big",), ctx_lens=(100 + i,), accepted=(3 * dec,), committed=(3 * dec,),
                               finished=(False,), draft_tokens=4, step_ms=5.0, phases_ms=PH if dec else {},
                               t_start_ns=T0 + i * 10**7))
    log.end(RequestEnd("big", retracted=True, t_ns=T0 + 10**9))
    big = log.get("big")
    assert big["aborted"] == names.ABORT_RETRACTED and big["steps"] == 20
    view.export_request(big)
    view.export_request(aborted_summary(RequestEnd("never", t_ns=T0 + 2 * 10**9)))
    view.flush()
    assert [(s.name, s.attributes[names.ATTR_RID], s.attributes[names.ATTR_ABORTED]) for s in exp.spans] == \
        [(names.SPAN_REQUEST, "never", names.ABORT_QUEUED)]
    d = stats.to_dict()
    assert d["requests_exported"] == 1 and d["requests_dropped"] == 1
    assert d["spans_exported"] == 1 and d["spans_dropped"] == 2 + 20
    view.shutdown()


def test_a_malformed_step_row_exports_nothing_of_its_request():
    """Every row is read before the first span starts: a row that cannot be read raises before any
    span exists, so no step of the request is exported without its root."""
    exp = _Recording()
    exp.release.set()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=64)
    view = OtelView(prov, stats)
    req = _request("bad", 3)
    rows = [dict(r) for r in req["step_rows"]]
    del rows[-1]["batch_size"]
    with pytest.raises(KeyError):
        view.export_request({**req, "step_rows": rows})
    view.export_request(_request("good", 1))
    view.flush()
    assert {s.attributes.get(names.ATTR_RID) for s in exp.spans if s.name == names.SPAN_REQUEST} == {"good"}
    assert len(exp.spans) == 2 + SPANS_PER_STEP  # the good request whole, nothing of the bad one
    assert stats.to_dict()["requests_exported"] == 1
    view.shutdown()


def test_a_request_whose_phase_spans_never_fit_is_exported_whole_with_phases_as_attributes():
    """1,100 decode steps need 8,802 spans, more than the default queue (8,192) ever holds: a long
    request, the kind this tool is for, would never be traced.  It goes out whole, one span a step,
    its phases as the step span's attributes, and is counted apart."""
    exp = _Recording()
    exp.release.set()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp)  # the default queue
    view = OtelView(prov, stats)
    view.export_request(_request("long", 1100))
    view.export_request(_request("short", 3))
    view.flush()
    by_rid = {s.attributes[names.ATTR_RID]: v for v in _by_trace(exp.spans).values() for s in v
              if s.name == names.SPAN_REQUEST}
    assert {r: len(v) for r, v in by_rid.items()} == {"long": 2 + 1100, "short": 2 + 3 * SPANS_PER_STEP}
    root = next(s for s in by_rid["long"] if s.name == names.SPAN_REQUEST)
    assert root.attributes[names.ATTR_LAYOUT] == names.LAYOUT_ATTRIBUTES
    steps = [s for s in by_rid["long"] if s.name == names.SPAN_STEP]
    assert len(steps) == 1100 and all(s.attributes[names.ATTR_LAYOUT] == names.LAYOUT_ATTRIBUTES for s in steps)
    ms = {k[len(names.ATTR_PHASE_MS_PREFIX):]: v for k, v in steps[0].attributes.items()
          if k.startswith(names.ATTR_PHASE_MS_PREFIX)}
    leaves = {p: v for p, v in PH.items() if p != "verify"}  # verify is its parts: attn, moe, rest
    assert ms == pytest.approx(leaves) and sum(ms.values()) == pytest.approx(steps[0].attributes[names.ATTR_STEP_MS])
    d = stats.to_dict()
    assert d["requests_exported"] == 2 and d["requests_compact"] == 1 and d["requests_dropped"] == 0
    view.shutdown()


@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_SAMPLER": "always_off"}])
def test_our_tail_decision_exports_under_an_unsampled_parent_and_any_head_sampler(monkeypatch, env):
    """A gateway that samples 1% sends most requests with an unsampled ``traceparent`` (flags 00),
    and an operator may set ``OTEL_TRACES_SAMPLER`` for SGLang's own tracing: the request was chosen
    by our trace policy already, so it goes out whole, in the client's trace, and is counted once."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    exp = _Recording()
    exp.release.set()
    prov, stats = build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp)
    view = OtelView(prov, stats)
    req = dict(_request("r", 2), trace_parent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-00")
    assert view.export_request(req)
    view.flush()
    root = next(s for s in exp.spans if s.name == names.SPAN_REQUEST)
    assert len(exp.spans) == 2 + 2 * SPANS_PER_STEP and root.context.trace_id == int("ab" * 16, 16)
    assert root.parent.span_id == int("cd" * 8, 16) and stats.to_dict()["requests_exported"] == 1
    view.shutdown()
