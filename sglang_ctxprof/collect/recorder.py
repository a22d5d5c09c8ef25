"""Hand-off from the hot path to the aggregator: a bounded queue and a daemon drain thread.

The scheduler thread calls :meth:`Recorder.submit` with a finished record; it never blocks
(``put_nowait``) and counts a drop when the queue is full.  A daemon thread drains the queue into
the aggregator and then into any extra sinks (OTel, logs, metrics), each under the fault guard.
:meth:`flush` drains synchronously, so a snapshot always includes every submitted record.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Iterable

from ..aggregate.aggregator import Aggregator
from ..model.records import StepRecord
from ..model.guard import Guard

logger = logging.getLogger(__name__)

Sink = Callable[[StepRecord], None]


class Recorder:
    def __init__(self, aggregator: Aggregator, guard: Guard, maxsize: int = 65536,
                 sinks: Iterable[tuple[str, Sink]] = ()) -> None:
        self.aggregator = aggregator
        self.guard = guard
        self._q: "queue.Queue[StepRecord]" = queue.Queue(maxsize=maxsize)
        self._lock = threading.Lock()  # serialises aggregator access (drain thread vs snapshot)
        self.sinks: list[tuple[str, Sink]] = list(sinks)
        self.submitted = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- hot path -----------------------------------------------------------------------------
    def submit(self, rec: StepRecord) -> None:
        if not self.guard.ok("recorder"):
            return
        try:
            self._q.put_nowait(rec)
            self.submitted += 1
        except queue.Full:
            self.dropped += 1

    # ---- drain -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ctxprof-recorder", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                rec = self._q.get(timeout=0.25)
            except queue.Empty:
                continue
            with self._lock:
                self._consume(rec)

    def _consume(self, rec: StepRecord) -> None:
        if not self.guard.ok("recorder"):
            return
        self.guard.run("aggregator", self.aggregator.observe, rec)
        for name, sink in self.sinks:
            self.guard.run(name, sink, rec)

    def flush(self) -> None:
        with self._lock:
            while True:
                try:
                    rec = self._q.get_nowait()
                except queue.Empty:
                    return
                self._consume(rec)

    def with_aggregator(self, fn: Callable[[Aggregator], Any]) -> Any:
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
