"""The exporters of one scheduler: three record sinks in a plain list, built from the configuration.

Each is a :class:`~sglang_ctxprof.model.sinks.RecordSink` that the recorder feeds on its drain
thread (never on the scheduler's hot path), after the aggregator, each under its own fault-guard
component (its ``name``):

* :class:`RequestSink` (``exporter``): when a record says a request finished, reads that request
  (the use of its rid that this record finished: a client may have used the rid again by then),
  from the aggregator's one request history (with its step rows only while it may become a trace:
  OTel on and the policy not ``off``), takes the tail-based decision
  (``views/policy``) -> OTel spans (``views/otel``) and the ``slow_request`` log event
  (``views/logs``).  A request that was in flight across a ``/ctx_profile/reset`` is exported with
  the steps recorded since the reset.  A request SGLang aborted while it waited (a ``RequestEnd``,
  ``end``) is decided the same way, from the history or as one of no steps, and gets its
  ``request_aborted`` event.  It owns the tail-sampling policy, which can be changed at
  run time (``set_policy``, reached through the control channel); the OTel provider is then built
  on first need;
* :class:`StepLogSink` (``logs``): ``slow_step`` events and the window counters of
  ``ctx_profile_summary``;
* :class:`MetricsSink` (``metrics``): the live Prometheus histogram and counters (``views/metrics``),
  the aborted requests' counter from each ``RequestEnd``, only when SGLang runs with ``--enable-metrics``.

What they need from the process (the rank, the served model, ``--enable-metrics``, the request
history, the drop count, the guard's status) reaches them in one
:class:`~sglang_ctxprof.model.sinks.BindFacts`, handed over by :meth:`Exporters.bind` when the
profiler binds to its scheduler.  Only the primary scheduler (attention rank 0) of each DP group emits
(other TP ranks see the same steps).  ``Exporters.status()`` feeds ``/ctx_profile`` (drop counts).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from itertools import compress
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..model import names
from ..model.buckets import Bucketing
from ..model.config import DEFAULT_OTEL_QUEUE, CtxProfConfig
from ..aggregate.request_entry import aborted_summary
from ..model.records import RequestEnd, StepRecord
from ..model.sinks import BindFacts, RecordSink
from .policy import TracePolicy

if TYPE_CHECKING:
    from .logs import LogView
    from .metrics import MetricsView
    from .otel import OtelView

logger = logging.getLogger(__name__)

# Finished request ids remembered so that a request is decided once even if a later record repeats
# its finish (bounded; the oldest ids are forgotten first).
MAX_DECIDED = 4096


class RequestSink:
    """``exporter``: finished requests -> tail decision -> OTel spans and ``slow_request`` events."""

    name = "exporter"

    def __init__(self, bucketing: Bucketing, policy: TracePolicy, facts: BindFacts, *,
                 env: Optional[Mapping[str, str]] = None, logs: Optional[LogView] = None,
                 otel: Optional[OtelView] = None, otel_queue: int = DEFAULT_OTEL_QUEUE) -> None:
        self.bucketing = bucketing
        self.policy = policy
        self.facts = facts
        self.env = dict(os.environ if env is None else env)  # the standard OTEL_* exporter variables
        self.otel_queue = otel_queue
        self.logs = logs
        self.otel = otel
        self.otel_error: Optional[str] = None
        self._decided: "OrderedDict[tuple[str, int], None]" = OrderedDict()
        self.finished = 0
        self.traced = 0
        if policy.mode != "off" and otel is None:
            self._ensure_otel()

    def current_policy(self) -> TracePolicy:
        return self.policy

    # ---- OTel provider (lazy: also when the policy is switched on at run time) ---------------------
    def _ensure_otel(self) -> None:
        if self.otel is not None or self.otel_error is not None:
            return
        try:
            from .otel import OtelView, build_provider

            provider, stats = build_provider(self.env, queue=self.otel_queue)
            bk = self.bucketing
            self.otel = OtelView(provider, stats, bucket_label=lambda c: bk.label(bk.index(c)))
        except Exception as exc:  # noqa: BLE001 - no OTel: tracing off, profiling goes on
            self.otel_error = f"{type(exc).__name__}: {exc}"
            logger.warning("sglang-ctxprof: OpenTelemetry export unavailable (%s); spans are off",
                           self.otel_error)

    def set_policy(self, changes: Mapping[str, Any]) -> TracePolicy:
        pol = self.policy.updated(changes)
        self.policy = pol
        if pol.mode != "off":
            self._ensure_otel()
        return pol

    def _tracking(self) -> bool:
        return self.logs is not None or self._tracing(self.policy)

    def _tracing(self, policy: TracePolicy) -> bool:
        """Whether a finished request may become a trace under ``policy`` (only then are its step
        rows read)."""
        return self.otel is not None and policy.mode != "off"

    def observe(self, rec: StepRecord) -> None:
        if True not in rec.finished or not self._tracking() or not self.facts.primary:
            return
        policy = self.policy  # one policy for the rows read and the decision (a switch may come meanwhile)
        steps = self._tracing(policy)
        for rid in compress(rec.rids, rec.finished):  # the finished ones, picked in C
            req = self.facts.history(rid, steps, rec.end_ns)
            if req is not None and self._first(rid, rec.end_ns):
                self.finish(req, policy)

    def end(self, end: RequestEnd) -> None:
        """A request SGLang aborted while it waited: exported like any finished request, from the
        history (with its steps) or, aborted before its first step, as a request of no steps."""
        if not self._tracking() or not self.facts.primary:
            return
        policy = self.policy
        req = self.facts.history(end.rid, self._tracing(policy), end.t_ns)
        if not self._first(end.rid, end.t_ns):
            return
        self.finish(req if req is not None and req.get("aborted") == end.kind else aborted_summary(end), policy)

    def _first(self, rid: str, stamp: int) -> bool:
        """Whether the use of ``rid`` that the record or end stamped ``stamp`` finished is decided
        for the first time (a reused rid is a new use with a stamp of its own, after a reset too)."""
        key = (rid, stamp)
        if key in self._decided:
            return False
        self._decided[key] = None
        if len(self._decided) > MAX_DECIDED:
            self._decided.popitem(last=False)
        return True

    def finish(self, req: Mapping[str, Any], policy: Optional[TracePolicy] = None) -> None:
        """Decide one finished request under ``policy`` (the current one if None), then export it."""
        self.finished += 1
        export, reason = (policy or self.policy).should_export(req)
        traced = False
        if export and self.otel is not None and self.otel.export_request(req, reason):
            self.traced += 1
            traced = True
        if self.logs is not None:  # the log view's own fault: the traces go on
            self.facts.guarded("logs", self._log, self.logs, req, reason, traced)

    @staticmethod
    def _log(logs: LogView, req: Mapping[str, Any], reason: str, traced: bool) -> None:
        logs.on_request(req, reason, traced)
        if req.get("aborted"):
            logs.on_abort(req, traced)

    def dropped(self) -> int:
        return int(self.otel.stats.dropped) if self.otel is not None else 0

    def stop(self) -> None:
        if self.otel is not None:
            self.otel.shutdown()


class StepLogSink:
    """``logs``: ``slow_step`` events and the summary window of the structlog view."""

    name = "logs"

    def __init__(self, logs: Optional[LogView], facts: BindFacts) -> None:
        self.logs = logs
        self.facts = facts

    def observe(self, rec: StepRecord) -> None:
        if self.logs is not None and self.facts.primary:
            self.logs.on_step(rec)

    def stop(self) -> None:
        if self.logs is not None:
            self.logs.stop()


class MetricsSink:
    """``metrics``: the live Prometheus series, built when the profiler binds at the scheduler's first
    step, hooks broken or not (so the degraded gauge exists, and hears the guard, before any record:
    a failure may stop every record) if SGLang
    exports metrics; a sink never bound builds them on its first record.  Every rank shows its own
    failures on the degraded gauge (``livemax`` over the processes); only the primary counts steps."""

    name = "metrics"

    def __init__(self, bucketing: Bucketing, facts: BindFacts) -> None:
        self.bucketing = bucketing
        self.facts = facts
        self.view: Optional[MetricsView] = None
        self._checked = False

    def _view(self) -> Optional[MetricsView]:
        if not self._checked:
            self._checked = True
            f = self.facts
            if f.metrics_enabled:
                from .metrics import maybe_create

                self.view = maybe_create(self.bucketing, True, model=f.model_name, dropped=f.dropped,
                                         sink_dropped=f.sink_dropped, degraded=f.degraded, audit=f.audit,
                                         counts=f.counts)
                if self.view is not None:
                    f.watch_faults(self.view.refresh_degraded)
                    self.view.refresh_degraded()
        return self.view if self.facts.primary else None

    def bind(self, facts: BindFacts) -> None:
        self.facts = facts
        facts.guarded("metrics", self._view)

    def observe(self, rec: StepRecord) -> None:
        view = self._view()
        if view is not None:
            view.observe(rec)

    def end(self, end: RequestEnd) -> None:
        view = self._view()
        if view is not None:
            view.on_abort(end.kind)

    def stop(self) -> None:
        """Unregister the live families (a later session in this process registers its own); a
        stopped sink builds none again (a drain thread stuck past the stop may still call it)."""
        view, self.view, self._checked = self.view, None, True
        if view is not None:
            view.close()


class Exporters:
    """The three sinks of one scheduler in a plain list (:attr:`sinks`), the facts they share, and
    the reporting the control channel reads (``trace_policy``, ``status``)."""

    def __init__(self, bucketing: Bucketing, policy: TracePolicy, *, facts: BindFacts = BindFacts(),
                 env: Optional[Mapping[str, str]] = None, logs: Optional[LogView] = None,
                 otel: Optional[OtelView] = None, otel_queue: int = DEFAULT_OTEL_QUEUE) -> None:
        self.facts = facts
        self.requests = RequestSink(bucketing, policy, facts, env=env, logs=logs, otel=otel,
                                    otel_queue=otel_queue)
        self.steps = StepLogSink(logs, facts)
        self.metrics = MetricsSink(bucketing, facts)
        self.sinks: list[RecordSink] = [self.requests, self.steps, self.metrics]

    def bind(self, facts: BindFacts) -> None:
        """The facts known once the profiler is bound to its scheduler (rank, model, metrics...)."""
        self.facts = self.requests.facts = self.steps.facts = facts
        self.metrics.bind(facts)

    def attach_logs(self, logs: LogView) -> None:
        """The structlog view, built after the request sink whose policy it reads."""
        self.requests.logs = self.steps.logs = logs

    def pause(self) -> None:
        """Profiling switched off: the log summary thread ends (:meth:`resume`); the OTel export
        thread and a log pipe's writer stay, idle, with nothing queued."""
        if self.steps.logs is not None:
            self.steps.logs.pause()

    def resume(self) -> None:
        if self.steps.logs is not None:
            self.steps.logs.start()

    @property
    def policy(self) -> TracePolicy:
        return self.requests.policy

    def set_policy(self, changes: Mapping[str, Any]) -> None:
        self.requests.set_policy(changes)

    def policy_dict(self) -> dict[str, Any]:
        return self.requests.policy.to_dict()

    def status(self) -> dict[str, Any]:
        r, logs, m = self.requests, self.steps.logs, self.metrics.view
        return {
            "policy": r.policy.to_dict(),
            "requests_finished": r.finished,
            "requests_traced": r.traced,
            "otel": r.otel.stats.to_dict() if r.otel is not None else None,
            "otel_error": r.otel_error,
            "spans_dropped": r.dropped(),
            "logs": logs.status() if logs is not None else None,
            "metrics": {"observed": m.observed} if m is not None else None,
        }


def build(config: CtxProfConfig, env: Optional[Mapping[str, str]] = None) -> Exporters:
    """The exporters configured by ``config`` (its ``trace``, ``logs`` and ``export`` parts); ``env``
    holds only the standard ``OTEL_*`` exporter variables.  Starts the log view's summary thread."""
    exp = Exporters(config.bucketing(), TracePolicy.from_settings(config.trace), env=env,
                    otel_queue=config.export.otel_queue)
    if config.logs.fmt != "off":
        try:
            from .logs import LogView

            logs = LogView(config.logs, exp.requests.current_policy)
        except ImportError:
            logger.warning("sglang-ctxprof: structlog is not installed; %s is ignored", names.ENV_LOG)
        except OSError as exc:  # a path we cannot write, or a FIFO with no reader: logs off, the rest on
            logger.warning("sglang-ctxprof: cannot open the log destination %s (%s); logs are off",
                           config.logs.dest, exc)
        else:
            exp.attach_logs(logs)
            logs.start()
    return exp


def install(config: CtxProfConfig, env: Optional[Mapping[str, str]] = None) -> Optional[Exporters]:
    """:func:`build`, for the session's exporter factory: never raises into SGLang (a bad tracing
    setting leaves the profiler running without exporters)."""
    try:
        return build(config, env)
    except Exception as exc:  # noqa: BLE001 - a bad tracing setting must not stop the profiler
        logger.warning("sglang-ctxprof: tracing sinks not installed: %s", exc)
        return None
