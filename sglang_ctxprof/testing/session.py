"""Instrument in set-up, uninstrument in tear-down: the one fixture tests and benches share.

``with instrumented(targets) as session:`` builds a
:class:`~sglang_ctxprof.collect.session.CtxProfSession` over the given hook targets (fake
SGLang-shaped classes in tests), instruments, and always uninstruments on the way out, so no hook,
thread or handle outlives the block.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from ..aggregate.aggregator import Aggregator
from ..collect.profiler import Profiler
from ..collect.session import CtxProfSession
from ..model.config import CtxProfConfig
from ..model.records import StepRecord
from ..model.sinks import BindFacts


@contextlib.contextmanager
def instrumented(targets: Iterable[Any], config: Optional[CtxProfConfig] = None,
                 **kwargs: Any) -> Iterator[CtxProfSession]:
    session = CtxProfSession(config if config is not None else CtxProfConfig(), targets=targets, **kwargs)
    session.instrument()
    try:
        yield session
    finally:
        session.uninstrument()


class Capture:
    """A record sink that keeps every record the profiler's recorder drains (what tests read instead
    of a production ring): ``Capture(profiler).records()`` flushes, then returns them in order."""

    name = "capture"

    def __init__(self, profiler: Profiler) -> None:
        self._profiler = profiler
        self._got: list[StepRecord] = []
        profiler.recorder.sinks.append(self)

    def observe(self, rec: StepRecord) -> None:
        self._got.append(rec)

    def stop(self) -> None:
        return None

    def records(self) -> list[StepRecord]:
        self._profiler.recorder.flush()
        return list(self._got)


T = TypeVar("T")


def fed(make: Callable[[BindFacts], T]) -> T:
    """Exporters built by ``make(facts)`` over a fresh aggregator's request history, whose request
    sink (``.requests``) first feeds that aggregator, as the recorder's drain thread does (the sink
    reads finished requests from its history)."""
    agg = Aggregator()
    exporters = make(BindFacts(history=lambda rid, with_steps, stamp: agg.finished_request(
        rid, stamp, lazy=True, with_steps=with_steps)))
    sink = getattr(exporters, "requests")
    observe = sink.observe

    def feed_then_observe(rec: StepRecord) -> None:
        agg.observe(rec)
        observe(rec)

    sink.observe = feed_then_observe
    return exporters
