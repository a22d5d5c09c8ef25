"""Our own OpenTelemetry provider and its export counters: the setup behind ``views.otel``.

:func:`build_provider` is the only global-free setup (it never calls ``trace.set_tracer_provider``):
a ``TracerProvider`` from the standard ``OTEL_*`` environment, sampling always on (the trace
policy's tail decision chose each request already: neither a client's unsampled ``traceparent`` nor
``OTEL_TRACES_SAMPLER`` may drop one counted exported), and a ``BatchSpanProcessor`` (export on its
own thread, off the hot path) whose queue our :class:`ExportStats` bounds: :meth:`ExportStats.admit`
says whether a request's spans fit in the room left, so ``OtelView`` drops a request whole
(``requests_dropped``, its spans in ``spans_dropped``) and never cuts one.  A failed batch is
dropped and counted, with one warning of ours: the OTLP exporters' own line per failed batch is
filtered out while *our* export runs (SGLang's own ``--enable-trace`` exporter logs as before), and
the filter leaves those loggers when the provider shuts down.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping, Optional, Sequence

from ..model import names
from ..model.config import DEFAULT_OTEL_QUEUE

DEFAULT_QUEUE = DEFAULT_OTEL_QUEUE
logger = logging.getLogger(__name__)
# Loggers where the OTLP exporters report each failed batch.  A filter drops those lines when they
# come from *our* export thread only (SGLang's own --enable-trace exporter logs as before): a down
# collector costs one warning of ours plus the drop count, not a log line per batch.
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                     "opentelemetry.exporter.otlp.common.http",
                     "opentelemetry.exporter.otlp.proto.grpc.exporter")


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
            if quiet is None:
                return self._export(spans)
            quiet.ident = threading.get_ident()  # the exporter's own warnings, from this export only
            try:
                return self._export(spans)
            finally:
                quiet.ident = None

        def _export(self, spans: Sequence[Any]) -> Any:
            n = len(spans)
            stats.add(handed=n)
            try:
                res = inner.export(spans)
            except Exception as exc:  # noqa: BLE001 - a broken collector is a drop, never an error
                return failed(n, f"{type(exc).__name__}: {exc}")
            if res == SpanExportResult.SUCCESS:
                stats.add(exported=n)
                return res
            return failed(n, "collector unreachable or refused the batch")

        def shutdown(self) -> None:  # the mirror of build_provider: the loggers lose our filter
            inner.shutdown()
            for name in _EXPORTER_LOGGERS if quiet is not None else ():
                logging.getLogger(name).removeFilter(quiet)

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
