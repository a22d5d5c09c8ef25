"""Instrument in set-up, uninstrument in tear-down: the one fixture tests and benches share.

``with instrumented(targets) as session:`` builds a
:class:`~sglang_ctxprof.collect.session.CtxProfSession` over the given hook targets (fake
SGLang-shaped classes in tests), instruments, and always uninstruments on the way out, so no hook,
thread or handle outlives the block.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Optional

from ..aggregate.aggregator import Aggregator
from ..collect.session import CtxProfSession
from ..model.config import CtxProfConfig


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
    """A sink that keeps every record the profiler's recorder drains (what tests read instead of a
    production ring): ``Capture(profiler).records()`` flushes, then returns them in order."""

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler
        self._got: list[Any] = []
        profiler.recorder.sinks.append(("capture", self._got.append))

    def records(self) -> list[Any]:
        self._profiler.recorder.flush()
        return list(self._got)


def fed(make: Callable[[Aggregator], Any]) -> Any:
    """Exporter sinks built by ``make(aggregator)`` whose ``on_record`` first feeds that aggregator,
    as the recorder's drain thread does (the sinks read finished requests from its history)."""
    agg = Aggregator()
    sinks = make(agg)
    sink = sinks.on_record

    def on_record(rec: Any) -> None:
        agg.observe(rec)
        sink(rec)

    sinks.on_record = on_record
    return sinks
