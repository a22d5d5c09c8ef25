"""Live Prometheus metrics, created in the scheduler process with ``prometheus_client``.

With SGLang's ``--enable-metrics`` SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it spawns the
schedulers, so metrics created here are written to that directory and SGLang's own ``/metrics``
(a ``MultiProcessCollector``) exports them next to its ``sglang:*`` families:

* ``sglang_ctxprof_phase_seconds`` histogram, labels ``phase`` and ``ctx_bucket``: seconds per
  decode step for every reported phase (``step``, ``draft``, ``verify``, ``verify_attn``, ...);
* ``sglang_ctxprof_accepted_tokens_total`` counter, label ``ctx_bucket``: accepted tokens (incl. bonus);
* ``sglang_ctxprof_steps_total`` counter, label ``ctx_bucket``: decode steps.

Label cardinality is bounded: ``phase`` is the closed phase vocabulary and ``ctx_bucket`` the label of
a configured bucket range (``Bucketing``, at most 256), keyed like ``/ctx_profile`` by the batch's
mean context entering the step; raw lengths never become labels.  Without ``--enable-metrics``
nothing is created (``/ctx_profile?format=prometheus`` renders the aggregate instead).
"""

from __future__ import annotations

from typing import Any, Optional

from ..model.buckets import Bucketing
from ..model.names import KIND_DECODE, METRIC_ACCEPTED, METRIC_PHASE_SECONDS, METRIC_STEPS, REPORTED_PHASES, Phase
from ..model.records import StepRecord

# Seconds: 100 us .. 10 s, covering a draft phase on a GPU to a long-context CPU step.
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0, 10.0)


class MetricsView:
    def __init__(self, bucketing: Bucketing, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        reg = REGISTRY if registry is None else registry
        self.bucketing = bucketing
        self.phase_seconds = Histogram(METRIC_PHASE_SECONDS, "Seconds per speculative decode step phase.",
                                       ["phase", "ctx_bucket"], buckets=PHASE_BUCKETS, registry=reg)
        self.accepted = Counter(METRIC_ACCEPTED, "Accepted tokens (incl. the bonus token) of decode steps.",
                                ["ctx_bucket"], registry=reg)
        self.steps = Counter(METRIC_STEPS, "Speculative decode steps.", ["ctx_bucket"], registry=reg)
        self.observed = 0

    def observe(self, rec: StepRecord) -> None:
        if rec.kind != KIND_DECODE or not rec.rids:
            return
        label = self.bucketing.label(self.bucketing.index(rec.ctx_mean))
        for name in REPORTED_PHASES:
            if name != Phase.STEP.value and name not in rec.phases_ms:
                continue
            self.phase_seconds.labels(name, label).observe(rec.phase(name) / 1e3)
        self.accepted.labels(label).inc(sum(rec.accepted))
        self.steps.labels(label).inc()
        self.observed += 1


def maybe_create(bucketing: Bucketing, enabled: bool, registry: Any = None) -> Optional[MetricsView]:
    """A view when SGLang exports metrics (``--enable-metrics``) and prometheus_client is present."""
    if not enabled:
        return None
    try:
        return MetricsView(bucketing, registry)
    except ImportError:
        return None
