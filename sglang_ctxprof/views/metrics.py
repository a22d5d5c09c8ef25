"""Live Prometheus metrics, created in the scheduler process with ``prometheus_client``.

With SGLang's ``--enable-metrics`` SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it spawns the
schedulers, so metrics created here are written to that directory and SGLang's own ``/metrics``
(a ``MultiProcessCollector``) exports them next to its ``sglang:*`` families:

* ``sglang_ctxprof_phase_seconds`` histogram, labels ``phase`` and ``ctx_bucket``: seconds per
  decode step for every reported phase (``step``, ``draft``, ``verify``, ``verify_attn``, ...);
* ``sglang_ctxprof_accepted_tokens_total`` counter, label ``ctx_bucket``: accepted tokens (incl. bonus);
* ``sglang_ctxprof_steps_total`` counter, label ``ctx_bucket``: decode steps;
* ``sglang_ctxprof_request_steps_total`` counter, label ``ctx_bucket``: request-steps (steps x batch
  size), the denominator of "accepted tokens per step" as ``/ctx_profile`` reports it;
* ``sglang_ctxprof_draft_tokens_total`` counter, label ``ctx_bucket``: draft budget x batch size;
* ``sglang_ctxprof_position_accepted_total`` and ``sglang_ctxprof_position_observed_total`` counters,
  labels ``ctx_bucket`` and ``position``: request-steps whose draft position ``i`` (1..32) was accepted,
  and those whose draft budget reached ``i``, so ``p_i`` = accepted rate / observed rate, exactly the
  ``acceptance_by_position`` of ``/ctx_profile`` (both count with ``acceptance.count_record``; here,
  as there, ``ctx_bucket`` is each *request's own* context, and a position beyond a step's adaptive
  budget is unobserved, not rejected);
* ``sglang_ctxprof_prefill_cached_tokens_total`` counter, label ``ctx_bucket`` (the prefill batch's
  mean prompt length, as ``/ctx_profile``'s prefill buckets): prompt tokens found in the prefix cache;
* ``sglang_ctxprof_dropped_records_total`` counter: records the hot path's bounded queue dropped
  (read from the recorder when the next record drains);
* ``sglang_ctxprof_sink_dropped_records_total`` counter: records the sinks missed when a stalled
  sink's backlog was full (the profile has them; these series, the traces and the logs do not);
* ``sglang_ctxprof_degraded`` gauge, label ``component``: 1 while that component of a scheduler is
  disabled after a failure, else 0 (updated as records drain and when the guard reports a failure
  or a heal; ``livemax`` over the scheduler processes); the HTTP routes' own ``http`` component is
  not on it (its failure is the routes' 503, whose body says so);
* ``sglang_ctxprof_invariant_violations_total`` counter, label ``invariant``: the self-audit's broken
  invariants (``aggregate.audit``; every invariant exported from the start, 0 is an answer);
* ``sglang_ctxprof_requests_aborted_total`` counter, label ``kind`` (``queued``, ``retracted``):
  requests SGLang aborted while they waited, one per ``RequestEnd`` as ``requests_aborted`` counts.

Every family carries ``model_name`` (the served model, the label SGLang's own ``sglang:*`` metrics use),
so one Prometheus scraping a fleet can select by model and by ``instance``.

Label cardinality is bounded: ``phase`` is the closed phase vocabulary and ``ctx_bucket`` the label of
a configured bucket range (``Bucketing``, at most 256), keyed like ``/ctx_profile`` by the batch's
mean context entering the step; raw lengths never become labels.  Without ``--enable-metrics``
nothing is created (``/ctx_profile?format=prometheus`` renders the aggregate instead).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional

from ..model.buckets import Bucketing
from ..model.guard import SCHEDULER_COMPONENTS
from ..model.names import (ABORT_KINDS, LABEL_ABORT_KIND, LABEL_COMPONENT, LABEL_CTX_BUCKET, LABEL_INVARIANT,
                           LABEL_PHASE, LABEL_POSITION, METRIC_REQUESTS_ABORTED, KIND_DECODE, LABEL_MODEL, MAX_POSITION_LABEL, METRIC_ACCEPTED, METRIC_DEGRADED,
                           METRIC_DRAFT_TOKENS, METRIC_DROPPED, METRIC_SINK_DROPPED, METRIC_INVARIANT_VIOLATIONS,
                           AUDIT_INVARIANTS,
                           METRIC_PHASE_SECONDS, METRIC_POSITION_ACCEPTED, METRIC_POSITION_OBSERVED,
                           METRIC_REQUEST_STEPS, METRIC_STEPS, METRIC_CACHED_TOKENS)
from ..model.records import PhaseShapes, StepRecord
from ..aggregate.acceptance import count_record
from ..model.sinks import Counts

# Seconds: 100 us .. 10 s, covering a draft phase on a GPU to a long-context CPU step.
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0, 10.0)


class MetricsView:
    """``dropped()`` gives the recorder's dropped-record count, ``degraded()`` the guard's status
    (``{"components": {name: why}}`` or None); both are read as records drain.  ``counts`` reads a
    record's acceptance: the aggregator's ``CountsMemo`` (its count of the same record, made just
    before), else a fresh ``count_record``."""

    def __init__(self, bucketing: Bucketing, registry: Any = None, model: str = "",
                 dropped: Callable[[], int] = lambda: 0,
                 sink_dropped: Callable[[], int] = lambda: 0,
                 degraded: Callable[[], Optional[Mapping[str, Any]]] = lambda: None,
                 audit: Callable[[], Optional[Mapping[str, int]]] = lambda: None,
                 counts: Optional[Counts] = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        self._registry = reg
        self._health = threading.Lock()  # the degraded gauge: the drain thread and a failing one
        m = LABEL_MODEL
        self.bucketing = bucketing
        self.model = model
        self._dropped_fn = dropped
        self._sink_dropped_fn = sink_dropped
        self._degraded_fn = degraded
        self._audit_fn = audit
        self._counts: Counts = counts if counts is not None else count_record  # the aggregator's memo, if given
        self.phase_seconds = Histogram(METRIC_PHASE_SECONDS, "Seconds per speculative decode step phase.",
                                       [m, LABEL_PHASE, LABEL_CTX_BUCKET], buckets=PHASE_BUCKETS, registry=reg)
        self.accepted = Counter(METRIC_ACCEPTED, "Accepted tokens (incl. the bonus token) of decode steps.",
                                [m, LABEL_CTX_BUCKET], registry=reg)
        self.steps = Counter(METRIC_STEPS, "Speculative decode steps.", [m, LABEL_CTX_BUCKET], registry=reg)
        self.req_steps = Counter(METRIC_REQUEST_STEPS, "Request-steps (decode steps x batch size).",
                                 [m, LABEL_CTX_BUCKET], registry=reg)
        self.draft_tokens = Counter(METRIC_DRAFT_TOKENS, "Draft token budget x batch size of decode steps.",
                                    [m, LABEL_CTX_BUCKET], registry=reg)
        self.position = Counter(METRIC_POSITION_ACCEPTED, "Request-steps whose draft position was accepted.",
                                [m, LABEL_CTX_BUCKET, LABEL_POSITION], registry=reg)
        self.observed_pos = Counter(METRIC_POSITION_OBSERVED,
                                    "Request-steps whose draft budget reached the draft position.",
                                    [m, LABEL_CTX_BUCKET, LABEL_POSITION], registry=reg)
        self.cached = Counter(METRIC_CACHED_TOKENS, "Prompt tokens of prefill batches found in the prefix cache.",
                              [m, LABEL_CTX_BUCKET], registry=reg)
        self.dropped = Counter(METRIC_DROPPED, "Step records dropped by the bounded hot-path queue.", [m],
                               registry=reg)
        self.sink_dropped = Counter(METRIC_SINK_DROPPED, "Records the sinks missed (a stalled sink's full backlog).",
                                    [m], registry=reg)
        self.degraded = Gauge(METRIC_DEGRADED, "1 while a ctxprof component is disabled after a failure.",
                              [m, LABEL_COMPONENT], registry=reg, multiprocess_mode="livemax")
        self.violations = Counter(METRIC_INVARIANT_VIOLATIONS, "Broken invariants found by the live self-audit.",
                                  [m, LABEL_INVARIANT], registry=reg)
        for inv in AUDIT_INVARIANTS:
            self.violations.labels(model, inv).inc(0)
        self.aborted = Counter(METRIC_REQUESTS_ABORTED, "Requests SGLang aborted while they waited, by how they waited.",
                               [m, LABEL_ABORT_KIND], registry=reg)
        for kind in ABORT_KINDS:
            self.aborted.labels(model, kind).inc(0)
        self._audit_seen: dict[str, int] = {}
        self.dropped.labels(model).inc(0)  # exported from the start: 0 is an answer
        self.sink_dropped.labels(model).inc(0)
        self._dropped_seen = self._sink_dropped_seen = 0
        self._degraded_seen: Optional[frozenset] = None
        self._update_health()
        self.observed = 0
        self._shapes: PhaseShapes = {}  # phases_ms keys -> what ``reported_phases`` reads
        self._kids: dict[int, _Kids] = {}  # decode ctx bucket index -> its children
        self._cached: dict[int, Any] = {}  # prefill ctx bucket index -> its cached-tokens child
        self._pos_kids: dict[tuple[int, int], tuple[Any, Any]] = {}  # (own bucket, position) -> children

    def _update_health(self) -> None:
        n = int(self._dropped_fn() or 0)
        if n > self._dropped_seen:
            self.dropped.labels(self.model).inc(n - self._dropped_seen)
            self._dropped_seen = n
        n = int(self._sink_dropped_fn() or 0)
        if n > self._sink_dropped_seen:
            self.sink_dropped.labels(self.model).inc(n - self._sink_dropped_seen)
            self._sink_dropped_seen = n
        self.refresh_degraded()
        for inv, n in (self._audit_fn() or {}).items():  # counts since start: a reset restarts none
            seen = self._audit_seen.get(inv, 0)
            if n > seen:
                self.violations.labels(self.model, inv).inc(n - seen)
                self._audit_seen[inv] = n

    def refresh_degraded(self) -> None:
        """The degraded gauge from the guard's status: as records drain, and when the guard says a
        component failed or all healed (``BindFacts.watch_faults``), which no record may follow."""
        with self._health:
            bad = frozenset(((self._degraded_fn() or {}).get("components") or {}))
            if bad != self._degraded_seen:
                for c in SCHEDULER_COMPONENTS:  # a scheduler's guard: the routes' (http) is not its to say
                    self.degraded.labels(self.model, c).set(1 if c in bad else 0)
                self._degraded_seen = bad

    def close(self) -> None:
        """Unregister every family, so a later view (a new session in this process) can register."""
        for c in (self.phase_seconds, self.accepted, self.steps, self.req_steps, self.draft_tokens, self.position,
                  self.observed_pos, self.cached, self.dropped, self.sink_dropped, self.degraded, self.violations,
                  self.aborted):
            try:
                self._registry.unregister(c)
            except KeyError:
                pass

    def on_abort(self, kind: str) -> None:
        """A request SGLang aborted while it waited (``RequestEnd.kind``)."""
        self.aborted.labels(self.model, kind).inc()

    def observe(self, rec: StepRecord) -> None:
        self._update_health()
        if not rec.rids:
            return
        lens = rec.bucket_lens
        i = self.bucketing.index(sum(lens) / len(lens))
        if rec.kind != KIND_DECODE:  # a prefill bucket is the batch's mean prompt length
            cached = self._cached.get(i)
            if cached is None:
                cached = self._cached[i] = self.cached.labels(self.model, self.bucketing.label(i))
            cached.inc(rec.cached_tokens)
            return
        kids = self._kids.get(i)
        if kids is None:
            kids = self._kids[i] = _Kids(self, self.bucketing.label(i))
        phase = kids.phase
        for name, ms in rec.reported_phases(self._shapes):
            child = phase.get(name)
            if child is None:
                child = phase[name] = self.phase_seconds.labels(self.model, name, kids.label)
            child.observe(ms / 1e3)
        kids.accepted.inc(sum(rec.accepted))
        kids.steps.inc()
        kids.req_steps.inc(rec.batch_size)
        kids.draft_tokens.inc(rec.draft_tokens * rec.batch_size)
        # per own-context bucket: [accepted, observed] request-steps per position (index 0 unused)
        labels: dict[int, list[list[int]]] = {}
        for (i, budget, correct), n in self._counts(rec, self.bucketing.edges).items():
            hit, seen = labels.setdefault(i, [[0] * (MAX_POSITION_LABEL + 1), [0] * (MAX_POSITION_LABEL + 1)])
            for pos in range(1, min(budget, MAX_POSITION_LABEL) + 1):
                seen[pos] += n
                if pos <= correct:
                    hit[pos] += n
        for i, (hit, seen) in labels.items():
            for pos in range(1, MAX_POSITION_LABEL + 1):
                if seen[pos]:
                    acc, obs = self._position(i, pos)
                    acc.inc(hit[pos])  # 0 is an answer: tried, never accepted
                    obs.inc(seen[pos])
        self.observed += 1

    def _position(self, i: int, pos: int) -> tuple[Any, Any]:
        """The (accepted, observed) children of own-context bucket ``i`` and draft position ``pos``."""
        kids = self._pos_kids.get((i, pos))
        if kids is None:
            own = self.bucketing.label(i)
            kids = self._pos_kids[(i, pos)] = (self.position.labels(self.model, own, str(pos)),
                                               self.observed_pos.labels(self.model, own, str(pos)))
        return kids


class _Kids:
    """One decode ``ctx_bucket``'s children of the families every decode record adds to, resolved
    on its first record, not per record (``labels()`` builds and looks up a label tuple under a lock
    on every call); the phase histogram's children as each phase is first seen, so no series
    appears before it has a value."""

    __slots__ = ("label", "phase", "accepted", "steps", "req_steps", "draft_tokens")

    def __init__(self, view: MetricsView, label: str) -> None:
        m = view.model
        self.label = label
        self.phase: dict[str, Any] = {}
        self.accepted = view.accepted.labels(m, label)
        self.steps = view.steps.labels(m, label)
        self.req_steps = view.req_steps.labels(m, label)
        self.draft_tokens = view.draft_tokens.labels(m, label)


def maybe_create(bucketing: Bucketing, enabled: bool, registry: Any = None, **kw: Any) -> Optional[MetricsView]:
    """A view when SGLang exports metrics (``--enable-metrics``) and prometheus_client is present;
    ``kw`` are :class:`MetricsView`'s ``model``, ``dropped``, ``sink_dropped``, ``degraded``, ``audit`` and
    ``counts``."""
    if not enabled:
        return None
    try:
        return MetricsView(bucketing, registry, **kw)
    except ImportError:
        return None
