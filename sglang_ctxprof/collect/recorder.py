"""Hand-off from the hot path to the aggregator: a bounded deque and a daemon drain thread.

The scheduler thread calls :meth:`Recorder.submit` with a finished record, or with a step's host
facts (``host.HostFacts``) whose record is built here, or with a :class:`RequestEnd` (a request
aborted while it waited: the aggregator's request history ends it); it never blocks (a deque append, no lock)
and counts a drop when ``maxsize`` items are waiting.  A daemon thread wakes every few
milliseconds, drains what is waiting into the aggregator and then into each
:class:`~sglang_ctxprof.model.sinks.RecordSink` of :attr:`Recorder.sinks` (OTel, logs, metrics,
capture triggers), each under its own fault-guard component, and times each item (``cost.Cost``:
this thread's CPU time, so waiting for the GIL while the scheduler thread runs is not counted as
our cost).  :meth:`flush` drains synchronously, so a snapshot always includes every submitted
record; :meth:`close` stops the thread, drains, and stops each sink.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Optional, TypeVar, Union

from ..aggregate.aggregator import Aggregator
from ..model.records import RequestEnd, StepRecord
from ..model.guard import Guard
from ..model.sinks import RecordSink
from .cost import Cost

if TYPE_CHECKING:
    from .host import HostFacts

logger = logging.getLogger(__name__)

Item = Union[StepRecord, "HostFacts", RequestEnd]  # a record, host facts whose record is built here, an end
T = TypeVar("T")

POLL_S = 0.005  # how long the idle drain thread sleeps between looks at the queue


class Recorder:
    def __init__(self, aggregator: Aggregator, guard: Guard, maxsize: int = 65536,
                 sinks: Iterable[RecordSink] = (), cost: Optional[Cost] = None) -> None:
        self.aggregator = aggregator
        self.guard = guard
        self.maxsize = maxsize
        self._q: deque[Item] = deque()
        self._lock = threading.Lock()  # serialises aggregator access (drain thread vs snapshot)
        self.sinks: list[RecordSink] = list(sinks)  # fed in order, after the aggregator
        self.cost = cost if cost is not None else Cost()
        self.submitted = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- hot path -----------------------------------------------------------------------------
    def submit(self, rec: Item) -> None:
        """Queue a :class:`StepRecord`, or host facts with a ``record()`` method (built when drained)."""
        if not self.guard.ok("recorder"):
            return
        if len(self._q) >= self.maxsize:
            self.dropped += 1
            return
        self._q.append(rec)
        self.submitted += 1

    def dropped_count(self) -> int:
        return self.dropped

    # ---- drain -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ctxprof-recorder", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._q:
                self.flush()
            else:
                self._stop.wait(POLL_S)

    def _consume(self, item: Item) -> None:
        if not self.guard.ok("recorder"):
            return
        t0 = time.thread_time_ns()
        if type(item) is RequestEnd:
            self.guard.run("aggregator", self.aggregator.end_request, item)
            return
        rec = item if type(item) is StepRecord else self.guard.run("recorder", item.record)
        if rec is not None:
            self.guard.run("aggregator", self.aggregator.observe, rec)
            for sink in self.sinks:
                self.guard.run(sink.name, sink.observe, rec)
        self.cost.add_drain(time.thread_time_ns() - t0)

    def flush(self) -> None:
        q = self._q
        with self._lock:
            while q:
                self._consume(q.popleft())

    def with_aggregator(self, fn: Callable[[Aggregator], T]) -> T:
        """Run ``fn(aggregator)`` after a flush, under the lock (snapshots, resets)."""
        self.flush()
        with self._lock:
            return fn(self.aggregator)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()
        self._stop.clear()

    def close(self) -> None:
        """Stop the drain thread, drain what is left, then stop each sink (its threads, providers),
        also one disabled after a failure: what it started must end."""
        self.stop()
        for sink in self.sinks:
            try:
                sink.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
                logger.warning("sglang-ctxprof: sink %r did not stop cleanly: %r", sink.name, exc)
