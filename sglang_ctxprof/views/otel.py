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

:func:`build_provider` is the only global-free setup: our own provider from the standard ``OTEL_*``
environment, a ``BatchSpanProcessor`` with a bounded queue (export on its own thread, off the hot path)
bounded by our own counter: a request whose spans do not fit in the room left is dropped whole
(``requests_dropped``, its spans in ``spans_dropped``), never cut (its root ends last; every step row is read
before its first span starts, so a row that cannot be read raises before any), and counters of exported and
dropped spans (:class:`ExportStats`) for ``/ctx_profile``. It never calls ``trace.set_tracer_provider``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

from ..aggregate.request_entry import output_tokens, rows_not_kept
from ..model import names
from ..model.config import DEFAULT_OTEL_QUEUE
from ..model.layout import PhaseSlice, lay_phases
from ..model.names import Phase
from ..model.records import step_end_ns
from .capture_refs import span_attrs

DEFAULT_QUEUE = DEFAULT_OTEL_QUEUE
logger = logging.getLogger(__name__)
SHUTDOWN_S = 3.0  # the longest the exporters' shutdown waits for the span queue to drain
# Loggers where the OTLP exporters report each failed batch.  A filter drops those lines when they
# come from *our* export thread only (SGLang's own --enable-trace exporter logs as before): a down
# collector costs one warning of ours plus the drop count, not a log line per batch.
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                     "opentelemetry.exporter.otlp.common.http",
                     "opentelemetry.exporter.otlp.proto.grpc.exporter")


def _utf8(s: str) -> str:  # a lone surrogate (a client's rid may hold one) written as an escape
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


class _OurExportThread(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.ident: Optional[int] = None
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.ident is not None and record.thread == self.ident:
            self.suppressed += 1
            return False
        return True


class ExportStats:
    """Span counters, updated from the exporter thread and our drain thread."""

    def __init__(self, max_queue: int = 0) -> None:
        self._lock = threading.Lock()
        self.max_queue = max_queue
        self.enqueued = 0
        self.handed = 0  # given to the exporter
        self.exported = 0
        self.dropped = 0  # queue overflow + failed exports
        self.failed_batches = 0
        self.failed = 0  # spans of failed exports (in ``dropped`` too)
        self.closed = False  # counts closed at shutdown: a late export's outcome is not counted again
        self.requests_exported = 0  # queued whole for export (a batch that fails later: its spans in dropped)
        self.requests_dropped = 0  # dropped whole: their spans did not fit in the queue's room
        self.requests_compact = 0  # exported with their phases as step attributes (never fit as spans)

    def admit(self, n: int) -> bool:
        """Room for a request's ``n`` spans (queued spans never exceed ``max_queue``; only the exporter
        thread frees room meanwhile), else the request is dropped whole and counted."""
        with self._lock:
            if self.max_queue and self.enqueued - self.handed + n > self.max_queue:
                self.dropped += n
                self.requests_dropped += 1
                return False
            return True

    def add(self, **kw: int) -> None:
        with self._lock:
            if self.closed:
                return
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def close(self) -> int:
        """At shutdown: the spans queued and never exported, nor failed (still queued, or in an export
        that did not return), counted dropped; later outcomes are not counted.  Returns how many."""
        with self._lock:
            left = max(0, self.enqueued - self.exported - self.failed)
            self.dropped += left
            self.closed = True
            return left

    def to_dict(self) -> dict[str, int]:
        with self._lock:
            return {"requests_exported": self.requests_exported, "requests_dropped": self.requests_dropped,
                    "requests_compact": self.requests_compact,
                    "spans_enqueued": self.enqueued,
                    "spans_exported": self.exported, "spans_dropped": self.dropped,
                    "failed_batches": self.failed_batches, "queue_size": self.max_queue}


def _counting_exporter(inner: Any, stats: ExportStats, quiet: Optional[_OurExportThread] = None) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    def failed(n: int, why: str) -> Any:
        stats.add(dropped=n, failed=n, failed_batches=1)
        if stats.failed_batches == 1:
            logger.warning("sglang-ctxprof: OTLP span export failed (%s); spans are dropped and counted "
                           "in /ctx_profile (spans_dropped), the server is not affected", why)
        return SpanExportResult.FAILURE

    class CountingExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> Any:
            n = len(spans)
            if quiet is not None:
                quiet.ident = threading.get_ident()
            stats.add(handed=n)
            try:
                res = inner.export(spans)
            except Exception as exc:  # noqa: BLE001 - a broken collector is a drop, never an error
                return failed(n, f"{type(exc).__name__}: {exc}")
            if res == SpanExportResult.SUCCESS:
                stats.add(exported=n)
                return res
            return failed(n, "collector unreachable or refused the batch")

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return CountingExporter()


def _counting_processor(bsp: Any, stats: ExportStats) -> Any:
    """Counts the spans the batch processor's full queue pushes out (it drops the oldest)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class CountingProcessor(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            bsp.on_start(span, parent_context)

        def on_end(self, span: Any) -> None:
            # Our own bound: spans not yet handed to the exporter never exceed max_queue (the SDK's
            # queue is larger, so it never drops silently); a span past the bound is dropped here
            # and counted.  At rest, exported + dropped == spans ended.
            if stats.max_queue and stats.enqueued - stats.handed >= stats.max_queue:
                stats.add(dropped=1)
                return
            stats.add(enqueued=1)
            bsp.on_end(span)

        def shutdown(self) -> None:
            bsp.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(bsp.force_flush(timeout_millis))

    return CountingProcessor()


def make_exporter(env: Mapping[str, str]) -> Any:
    """OTLP exporter from the standard environment (endpoint, headers, timeout are read by it)."""
    proto = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
             or "http/protobuf").strip()
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if proto == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as G
        except ImportError:
            raise ValueError("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc needs the extra sglang-ctxprof[grpc] (the package "
                             "opentelemetry-exporter-otlp-proto-grpc)") from None
        return G()
    raise ValueError(f"OTLP protocol {proto!r} is not supported: use grpc or http/protobuf")


def build_provider(env: Optional[Mapping[str, str]] = None, exporter: Any = None,
                   queue: int = DEFAULT_QUEUE) -> tuple[Any, ExportStats]:
    """Our own TracerProvider (never installed globally) and its export counters.  ``queue`` is
    the configured span queue (``export.otel_queue``); ``env`` holds the standard ``OTEL_*``
    exporter variables."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    env = os.environ if env is None else env
    stats = ExportStats(max_queue=queue)
    attrs = {} if _names_service(env) else {names.RESOURCE_SERVICE_NAME: names.DEFAULT_SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attrs), sampler=ALWAYS_ON)
    inner = exporter if exporter is not None else make_exporter(env)
    quiet = _OurExportThread()
    for name in _EXPORTER_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    bsp = BatchSpanProcessor(_counting_exporter(inner, stats, quiet), max_queue_size=2 * queue,
                             max_export_batch_size=min(512, queue))
    provider.add_span_processor(_counting_processor(bsp, stats))
    return provider, stats


def _names_service(env: Mapping[str, str]) -> bool:
    """Whether the operator named the service (``OTEL_SERVICE_NAME``, or ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``, both read by the SDK): our default must not override either."""
    attrs = (kv.split("=", 1)[0].strip() for kv in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","))
    return bool(env.get("OTEL_SERVICE_NAME")) or names.RESOURCE_SERVICE_NAME in attrs


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
