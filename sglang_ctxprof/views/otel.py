"""Finished requests -> OpenTelemetry spans with explicit start and end times.

:class:`OtelView` takes a ``TracerProvider`` and turns one finished request (a ``request_log``
summary with its ``step_rows``) into this tree, all ended at once (tail-based: see tracing_policy)::

    ctxprof.request            rid, prompt/output tokens, accepted per step, decode tok/s
    ├── ctxprof.prefill        summed prefill batch time, from the request's first record
    └── ctxprof.step           one per decode step: ctx_len, batch size, draft/accepted tokens, step ms
        ├── ctxprof.draft
        ├── ctxprof.verify
        │   ├── ctxprof.verify_attn
        │   ├── ctxprof.verify_moe
        │   └── ctxprof.verify_rest
        ├── ctxprof.draft_extend
        └── ctxprof.overhead   (or ctxprof.unattributed): the rest of the step span

Time layout, honestly: a step span starts at the record's ``t_start_ns`` (wall clock taken on the
CPU when ``run_batch`` began) and lasts ``step_ms``.  Phases are *measured durations* (CPU monotonic
intervals, or CUDA-event intervals on GPU), not timestamps; they are laid back to back inside the
step by ``model.layout`` (the trace export's layout), although real attention and MoE calls
interleave layer by layer (on GPU anchored on the step's CPU wall-clock start).  Each span carries
``ctxprof.phase_layout = "sequential"`` to say so.  The rid goes out as UTF-8 carries it.

A request whose spans could never fit the span queue, however empty (over ~1,000 decode steps at
the default queue of 8,192: 8 spans a step), goes out whole without phase spans: one span a step,
each leaf phase's ms an attribute of it (``ctxprof.phase_ms.<phase>``: they sum to the step),
``ctxprof.phase_layout = "attributes"`` on the root and its steps, and counted in
``requests_compact``.  One that does not fit even so (over ~8,190 steps) is dropped whole.

A request SGLang aborted while it waited is exported the same way, its root span named by
``ctxprof.aborted`` (``names.ABORT_KINDS``); one aborted before its first step is a root span alone,
at the time of the abort.  The request span names the deep captures that covered its steps
(``sglang.ctxprof.capture.*``: id, trigger, where to fetch it, the trace file, the steps covered; see
``views.capture_refs``), when the request summary lists them (``captures``).  Its parent is the
record's W3C ``traceparent`` when SGLang passed one (``adapter.req_trace_parent``), else a new trace;
no head sampler drops it (an unsampled parent, ``OTEL_TRACES_SAMPLER``): the trace policy chose it.

The provider and its counters are ``views.otel_export``'s (:func:`build_provider`, re-exported
here): a request whose spans do not fit in the span queue's room left is dropped whole, never cut
(its root ends last; every step row is read before its first span starts, so a row that cannot be
read raises before any).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

from ..aggregate.request_entry import output_tokens, rows_not_kept
from ..model import names
from ..model.layout import PhaseSlice, lay_phases
from ..model.names import Phase
from ..model.records import step_end_ns
from .capture_refs import span_attrs
from .otel_export import DEFAULT_QUEUE, ExportStats, build_provider  # noqa: F401 - the setup's names, here too

logger = logging.getLogger(__name__)
SHUTDOWN_S = 3.0  # the longest the exporters' shutdown waits for the span queue to drain


def _utf8(s: str) -> str:  # a lone surrogate (a client's rid may hold one) written as an escape
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _span_count(req: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], phases: bool = True) -> int:
    """The spans :meth:`OtelView.export_request` makes of a request: its root, its prefill, and per
    step the step span and (``phases``) one per laid-out phase (``model.layout``, as ``_step`` lays them)."""
    n = 1 + (float(req.get("prefill_ms") or 0.0) > 0)
    if not phases:
        return n + len(rows)
    for r in rows:
        s0 = int(r["t_start_ns"])
        n += 1 + len(lay_phases(r.get("phases_ms") or {}, s0, step_end_ns(s0, r["step_ms"])))
    return n


def _compacted(s0: int, s1: int, attrs: dict[str, Any],
               slices: list[PhaseSlice]) -> tuple[int, int, dict[str, Any], list[PhaseSlice]]:
    """A step's plan without phase spans: each leaf phase's ms (as its span would have lasted) an
    attribute, so they sum to the step as the spans tile it (a split phase is its parts)."""
    attrs[names.ATTR_LAYOUT] = names.LAYOUT_ATTRIBUTES
    parents = {sl.parent for sl in slices}
    for sl in slices:
        if sl.name not in parents:
            attrs[names.ATTR_PHASE_MS_PREFIX + sl.name] = (sl.end_ns - sl.start_ns) / 1e6
    return s0, s1, attrs, []


class OtelView:
    def __init__(self, tracer_provider: Any, stats: Optional[ExportStats] = None,
                 bucket_label: Optional[Callable[[float], str]] = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.provider = tracer_provider
        self.tracer = tracer_provider.get_tracer(names.TRACER_NAME)
        self.stats = stats or ExportStats()
        self.bucket_label = bucket_label

    def _parent(self, traceparent: str) -> Any:
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if traceparent:
            return TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        return Context()  # a new root: never the drain thread's ambient context

    def export_request(self, req: Mapping[str, Any], slow_reason: str = "") -> bool:
        """Queue the request's spans, all of them or (the span queue full) none: whether it was."""
        rows = list(req.get("step_rows") or ())
        t0 = int(req.get("t_first_ns") or (rows[0]["t_start_ns"] if rows else 0))
        t_end = int(req.get("t_end_ns") or 0)
        for r in rows:
            t_end = max(t_end, step_end_ns(r["t_start_ns"], r["step_ms"]))
        t_end = max(t_end, t0)
        attrs: dict[str, Any] = {
            names.ATTR_RID: _utf8(str(req["rid"])),
            names.ATTR_STEPS: int(req.get("steps") or 0),
            names.ATTR_ACCEPTED: int(req.get("accepted") or 0),
            names.ATTR_COMMITTED: int(req.get("committed") or 0),
            names.ATTR_ACCEPT_MEAN: float(req.get("accepted_per_step") or 0.0),
            names.ATTR_DECODE_TOK_S: float(req.get("decode_tok_s") or 0.0),
            names.ATTR_DECODE_MS: float(req.get("decode_ms") or 0.0),
            names.ATTR_FINISHED: bool(req.get("finished")),
            names.ATTR_LAYOUT: names.LAYOUT_SEQUENTIAL,
        }
        if req.get("partial"):  # steps went unseen: its output is not known
            attrs[names.ATTR_PARTIAL] = True
        if req.get("prompt_tokens") is not None:
            attrs[names.ATTR_PROMPT_TOKENS] = int(req["prompt_tokens"])
            attrs.update({} if req.get("partial") else {names.ATTR_OUTPUT_TOKENS: output_tokens(req)})
        if rows_not_kept(req):  # steps with no span: past the history's per-request or global row budget
            attrs[names.ATTR_STEPS_TRUNCATED] = rows_not_kept(req)
        if slow_reason:
            attrs[names.ATTR_SLOW_REASON] = slow_reason
        if req.get("aborted"):  # SGLang aborted it while it waited: names.ABORT_KINDS
            attrs[names.ATTR_ABORTED] = str(req["aborted"])
        if req.get("ctx_last") is not None:
            attrs[names.ATTR_CTX_LEN] = int(req["ctx_last"])
        if req.get("captures"):  # deep captures that covered its steps: views.capture_refs
            attrs.update(span_attrs(req["captures"], (r["step_id"] for r in rows)))
        plan = [self._step_plan(r) for r in rows]  # every row read before the first span starts
        n = _span_count(req, rows)
        cap = self.stats.max_queue
        compact = bool(cap) and n > cap  # could never fit as phase spans: one span a step
        if compact:
            n = _span_count(req, rows, phases=False)
            attrs[names.ATTR_LAYOUT] = names.LAYOUT_ATTRIBUTES
            plan = [_compacted(*step) for step in plan]
        if not self.stats.admit(n):
            return False  # the root ends last: a partial request would lose it, so none of it is queued
        root = self.tracer.start_span(names.SPAN_REQUEST, context=self._parent(str(req.get("trace_parent") or "")),
                                      start_time=t0, attributes=attrs)
        ctx = self._trace.set_span_in_context(root)
        n = 1
        pre_ms = float(req.get("prefill_ms") or 0.0)
        if pre_ms > 0:
            self._span(names.SPAN_PREFILL, ctx, t0, step_end_ns(t0, pre_ms),
                       {names.ATTR_PHASE: Phase.PREFILL.value})
            n += 1
        for step in plan:
            n += self._step(ctx, *step)
        root.end(end_time=t_end)
        self.stats.add(requests_exported=1, requests_compact=int(compact))
        return True

    def _span(self, name: str, ctx: Any, start: int, end: int, attrs: Mapping[str, Any]) -> Any:
        s = self.tracer.start_span(name, context=ctx, start_time=start, attributes=dict(attrs))
        s.end(end_time=max(start, end))
        return s

    def _step_plan(self, r: Mapping[str, Any]) -> tuple[int, int, dict[str, Any], list[PhaseSlice]]:
        """A step row's span times, attributes and phase slices, read whole: a malformed row raises
        here, before any span of its request exists, so a request is never exported in part."""
        s0 = int(r["t_start_ns"])
        s1 = step_end_ns(s0, r["step_ms"])
        attrs = {
            names.ATTR_STEP_ID: int(r["step_id"]),
            names.ATTR_CTX_LEN: int(r["ctx_len"]),
            names.ATTR_BATCH_SIZE: int(r["batch_size"]),
            names.ATTR_DRAFT_TOKENS: int(r["draft_tokens"]),
            names.ATTR_ACCEPTED: int(r["accepted"]),
            names.ATTR_COMMITTED: int(r["committed"]),
            names.ATTR_STEP_MS: float(r["step_ms"]),
            names.ATTR_LAYOUT: names.LAYOUT_SEQUENTIAL,
        }
        if self.bucket_label is not None:
            attrs[names.ATTR_CTX_BUCKET] = self.bucket_label(r["ctx_len"])
        return s0, s1, attrs, lay_phases(r.get("phases_ms") or {}, s0, s1)  # top phases, then children

    def _step(self, ctx: Any, s0: int, s1: int, attrs: dict[str, Any], slices: list[PhaseSlice]) -> int:
        step = self.tracer.start_span(names.SPAN_STEP, context=ctx, start_time=s0, attributes=attrs)
        sctx = self._trace.set_span_in_context(step)
        n, parents = 1, {}  # phase name -> its span (a split's children go under it)
        for sl in slices:
            parent = self._trace.set_span_in_context(parents[sl.parent]) if sl.parent else sctx
            parents[sl.name] = self._span(names.SPAN_PHASE_PREFIX + sl.name, parent, sl.start_ns, sl.end_ns,
                                          {names.ATTR_PHASE: sl.name})
            n += 1
        step.end(end_time=s1)
        return n

    def flush(self, timeout_ms: int = 30000) -> bool:
        return bool(self.provider.force_flush(timeout_ms))

    def shutdown(self, timeout_s: float = SHUTDOWN_S) -> None:
        """Stop the provider, waiting ``timeout_s`` at most (a collector that is down or hung must not
        hold a server's shutdown for the exporter's retries); what it leaves is counted dropped."""
        t = threading.Thread(target=self.provider.shutdown, name="ctxprof-otel-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)
        left = self.stats.close()
        if left:
            logger.warning("sglang-ctxprof: OTel shutdown left %d spans unexported (counted in spans_dropped)", left)
