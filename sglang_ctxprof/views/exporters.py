"""Builds the tracing sinks from the configuration and registers them on the Profiler's Recorder.

Three sinks run on the recorder's drain thread (never on the scheduler's hot path), each under its
own fault-guard component:

* ``exporter``: when a record says a request finished, reads that request, with its step rows,
  from the aggregator's one request history (the recorder feeds the aggregator before any sink),
  takes the tail-based decision (``views/policy``) -> OTel spans (``views/otel``) and the
  ``slow_request`` log event (``views/logs``).  A request that was in flight across a
  ``/ctx_profile/reset`` is exported with the steps recorded since the reset;
* ``logs``: ``slow_step`` events and the window counters of ``ctx_profile_summary``;
* ``metrics``: the live Prometheus histogram and counters (``views/metrics``), only when SGLang runs
  with ``--enable-metrics``.

Only the tp-rank-0 scheduler of each DP group emits (other TP ranks see the same steps).
The policy can be changed at run time (``set_policy``, reached through the control channel); the
OTel provider is then built on first need.  ``status()`` feeds ``/ctx_profile`` (drop counts).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional

from ..model import names
from ..model.records import StepRecord
from ..model.config import DEFAULT_OTEL_QUEUE
from .policy import TracePolicy

logger = logging.getLogger(__name__)


History = Callable[[str], Optional[Mapping[str, Any]]]

# Finished request ids remembered so that a request is decided once even if a later record repeats
# its finish (bounded; the oldest ids are forgotten first).
MAX_DECIDED = 4096


class Sinks:
    def __init__(self, bucketing: Any, policy: TracePolicy, *, history: History,
                 env: Optional[Mapping[str, str]] = None, logs: Any = None, otel: Any = None,
                 otel_queue: int = DEFAULT_OTEL_QUEUE, primary: Callable[[], bool] = lambda: True,
                 metrics_enabled: Callable[[], bool] = lambda: False,
                 metrics_args: Callable[[], Mapping[str, Any]] = dict) -> None:
        """``history(rid)`` returns a request's summary with its step rows (the aggregator's);
        ``metrics_args()`` the live metrics' ``model``, ``dropped`` and ``degraded`` (asked on first need)."""
        self.bucketing = bucketing
        self.policy = policy
        self.env = dict(os.environ if env is None else env)  # the standard OTEL_* exporter variables
        self.otel_queue = otel_queue
        self.logs = logs
        self.otel = otel
        self.otel_error: Optional[str] = None
        self.history = history
        self._decided: "OrderedDict[tuple[str, int], None]" = OrderedDict()
        self.primary = primary
        self._metrics_enabled = metrics_enabled
        self._metrics_args = metrics_args
        self.metrics: Any = None
        self._metrics_checked = False
        self.finished = 0
        self.traced = 0
        if policy.mode != "off" and otel is None:
            self._ensure_otel()

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

    def entries(self) -> list[tuple[str, Callable[[StepRecord], None]]]:
        return [("exporter", self.on_record), ("logs", self.on_step_log), ("metrics", self.on_metrics)]

    # ---- sinks -----------------------------------------------------------------------------------------
    def _tracking(self) -> bool:
        return self.logs is not None or (self.otel is not None and self.policy.mode != "off")

    def on_record(self, rec: StepRecord) -> None:
        if True not in rec.finished or not self._tracking() or not self.primary():
            return
        for i, rid in enumerate(rec.rids):
            if rec.finished[i]:
                req = self.history(rid)
                key = (rid, req.get("use", 0)) if req is not None else None
                if key is not None and key not in self._decided:  # a reused rid is a new request
                    self._decided[key] = None
                    if len(self._decided) > MAX_DECIDED:
                        self._decided.popitem(last=False)
                    self.finish(req)

    def finish(self, req: Mapping[str, Any]) -> None:
        pol = self.policy
        self.finished += 1
        export, reason = pol.should_export(req)
        traced = False
        if export and self.otel is not None:
            self.otel.export_request(req, reason)
            self.traced += 1
            traced = True
        if self.logs is not None:
            self.logs.on_request(req, reason, traced)

    def on_step_log(self, rec: StepRecord) -> None:
        if self.logs is not None and self.primary():
            self.logs.on_step(rec)

    def on_metrics(self, rec: StepRecord) -> None:
        if not self._metrics_checked:
            self._metrics_checked = True
            if self._metrics_enabled() and self.primary():
                from .metrics import maybe_create

                self.metrics = maybe_create(self.bucketing, True, **dict(self._metrics_args()))
        if self.metrics is not None:
            self.metrics.observe(rec)

    # ---- reporting ---------------------------------------------------------------------------------------
    def dropped(self) -> int:
        return int(self.otel.stats.dropped) if self.otel is not None else 0

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "requests_finished": self.finished,
            "requests_traced": self.traced,
            "otel": self.otel.stats.to_dict() if self.otel is not None else None,
            "otel_error": self.otel_error,
            "spans_dropped": self.dropped(),
            "logs": self.logs.status() if self.logs is not None else None,
            "metrics": {"observed": self.metrics.observed} if self.metrics is not None else None,
        }

    def stop(self) -> None:
        if self.logs is not None:
            self.logs.stop()
        if self.otel is not None:
            self.otel.shutdown()


def build(profiler: Any, env: Optional[Mapping[str, str]] = None,
          metrics_enabled: Callable[[], bool] = lambda: False,
          model_name: Callable[[], str] = lambda: "") -> Sinks:
    """Sinks for one scheduler's Profiler, configured by ``profiler.config`` (its ``trace``,
    ``logs`` and ``export`` parts); ``env`` holds only the standard ``OTEL_*`` exporter variables.

    ``metrics_enabled`` says whether SGLang runs with ``--enable-metrics`` (asked on first need,
    since the server arguments are known only once the profiler is bound); ``model_name`` the served
    model, the live metrics' ``model_name`` label."""
    cfg = profiler.config
    policy = TracePolicy.from_settings(cfg.trace)
    logs = None
    sinks_ref: list[Sinks] = []
    if cfg.logs.fmt != "off":
        from .logs import LogView

        try:
            logs = LogView(cfg.logs, lambda: sinks_ref[0].policy)
        except ImportError:
            logger.warning("sglang-ctxprof: structlog is not installed; %s is ignored", names.ENV_LOG)

    def primary() -> bool:
        r = getattr(profiler, "rank", None)
        return r is None or r.tp == 0

    def history(rid: str) -> Optional[Mapping[str, Any]]:
        return profiler.recorder.aggregator.request(rid, lazy=True)  # rows read only to export

    def metrics_args() -> dict[str, Any]:
        return {"model": model_name(), "dropped": lambda: profiler.recorder.dropped,
                "degraded": profiler.guard.status,
                "audit": lambda: profiler.aggregator.audit.counts if profiler.aggregator.audit else None}

    s = Sinks(cfg.bucketing(), policy, history=history, env=env, logs=logs, primary=primary,
              metrics_enabled=metrics_enabled, metrics_args=metrics_args, otel_queue=cfg.export.otel_queue)
    sinks_ref.append(s)
    if logs is not None:
        logs.start()
    return s


def install(profiler: Any, env: Optional[Mapping[str, str]] = None,
            metrics_enabled: Callable[[], bool] = lambda: False,
            model_name: Callable[[], str] = lambda: "") -> Optional[Sinks]:
    """Build the sinks and register them on ``profiler.recorder``; never raises into SGLang.
    Returns them (the session keeps them as ``profiler.sinks``), or None."""
    try:
        s = build(profiler, env, metrics_enabled, model_name)
    except Exception as exc:  # noqa: BLE001 - a bad tracing setting must not stop the profiler
        logger.warning("sglang-ctxprof: tracing sinks not installed: %s", exc)
        return None
    profiler.recorder.sinks.extend(s.entries())
    return s
