"""What the recorder hands each finished step to, and what the sinks learn when the profiler binds.

The recorder (``collect.recorder.Recorder``) feeds every :class:`~sglang_ctxprof.model.records.StepRecord`
first to the aggregator, then to each :class:`RecordSink` of its plain list, in order, each under
the fault-guard component named by the sink's ``name`` (a ``RequestEnd`` goes to the sinks that
also have an ``end(end)`` method, and a loss mark, in its place among the records, to those with a
``lost()``: steps went unrecorded there); on close it calls each sink's ``stop()``.
The sinks of a server are:

* ``views.exporters.RequestSink`` (``exporter``): a finished request -> tail decision -> OTel spans
  and the ``slow_request`` event;
* ``views.exporters.StepLogSink`` (``logs``): ``slow_step`` events and the summary window;
* ``views.exporters.MetricsSink`` (``metrics``): the live Prometheus series;
* ``collect.capture_triggers.CaptureSink`` (``capture``): the automatic deep-capture triggers.

The exporter sinks are built with the session (:class:`ExporterSet`), before SGLang has said which
rank this is; the profiler hands them :class:`BindFacts` once, when it binds to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from .records import StepRecord

# (rid, with its step rows?, the stamp of what finished it) -> that request's summary (its step rows
# read only when asked for): the stamp is the finishing record's ``end_ns`` or the end's ``t_ns``
History = Callable[[str, bool, int], Optional[Mapping[str, Any]]]
# (record, bucket edges) -> {(own context bucket, budget, correct drafts): request-steps}
Counts = Callable[[StepRecord, Sequence[int]], Mapping[tuple[int, int, int], int]]


class RecordSink(Protocol):
    """One consumer of finished step records, run on the recorder's drain thread."""

    name: str  # its fault-guard component: a failure disables this sink only

    def observe(self, rec: StepRecord) -> None: ...

    def stop(self) -> None: ...


class Policy(Protocol):
    """The trace policy's judgement of slowness (``views.policy.TracePolicy``), as collect reads it."""

    def step_is_slow(self, step_ms: float) -> bool: ...

    def slow_reason(self, summary: Mapping[str, Any]) -> str: ...


def _no_history(rid: str, with_steps: bool, stamp: int) -> Optional[Mapping[str, Any]]:
    return None


def _zero() -> int:
    return 0


def _healthy() -> Optional[Mapping[str, Any]]:
    return None


def _no_audit() -> Optional[Mapping[str, int]]:
    return None


def _no_policy() -> Optional[Policy]:
    return None


def _call(component: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _no_watch(fn: Callable[[], None]) -> None:
    return None


@dataclass(frozen=True)
class BindFacts:
    """What the exporter sinks need from the process, known once the profiler is bound.

    ``primary``: the first scheduler of its attention group (``adapter.emits``), the one that emits
    (its attention TP peers see the same steps); ``model_name``: the served model (metrics label); ``metrics_enabled``: SGLang runs
    with ``--enable-metrics``; ``history(rid, with_steps, stamp)``: from the aggregator's request
    history, the use of ``rid`` that the record or end stamped ``stamp`` finished (the recorder
    feeds the aggregator before any sink, and may have fed it later records, in which the rid may
    be used again; step rows only ``with_steps``); ``dropped()``: records the recorder's queue dropped;
    ``sink_dropped()``: records the sinks missed (a stalled sink's backlog was full);
    ``degraded()``: the fault guard's status (``{"components": {...}}`` or None); ``audit()``: the
    live self-audit's violations per invariant (``aggregate.audit``; None when it is off);
    ``policy()``: the exporters' trace policy as it is now (``ExporterSet.policy``, which
    ``POST /ctx_profile/trace_policy`` replaces; None without exporters), which the slow-request
    capture trigger judges with; ``counts``: the aggregator's acceptance counts of a record
    (``aggregate.acceptance.CountsMemo``, which remembers the aggregator's count of the record for
    the live metrics; None: they count afresh); ``guarded(component, fn, *args)``: the fault guard's
    ``run``, for a sink's work that belongs to another component (the request sink's log events are
    the ``logs`` component's); ``watch_faults(fn)``: the guard's ``listen``, ``fn()`` called after a
    component fails or all heal (the live degraded gauge, which no record refreshes once the
    records stop).  The defaults are a primary rank with no history, metrics off, no policy, plain
    calls and no fault listening (before bind, and in tests)."""

    primary: bool = True
    model_name: str = ""
    metrics_enabled: bool = False
    history: History = _no_history
    dropped: Callable[[], int] = _zero
    sink_dropped: Callable[[], int] = _zero
    degraded: Callable[[], Optional[Mapping[str, Any]]] = _healthy
    audit: Callable[[], Optional[Mapping[str, int]]] = _no_audit
    policy: Callable[[], Optional[Policy]] = _no_policy
    counts: Optional[Counts] = None
    guarded: Callable[..., Any] = _call
    watch_faults: Callable[[Callable[[], None]], None] = _no_watch


class ExporterSet(Protocol):
    """The exporters of one scheduler (``views.exporters.Exporters``): their sinks, the bind-time
    facts they share, and the tail-sampling policy the control channel reads and changes."""

    @property
    def sinks(self) -> Sequence[RecordSink]: ...

    def bind(self, facts: BindFacts) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    @property
    def policy(self) -> Policy: ...

    def set_policy(self, changes: Mapping[str, Any]) -> None: ...

    def policy_dict(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...
