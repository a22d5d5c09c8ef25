"""Hand-off from the hot path to the aggregator: a bounded deque and a daemon drain thread.

The scheduler thread calls :meth:`Recorder.submit` with a finished record, or with a step's host
facts (``host.HostFacts``) whose record is built here in stages (their plain facts,
``model.facts.StepFacts``, then the record: ``build``, two stages each), or with a
:class:`RequestEnd` (a request aborted while it waited: the aggregator's request history ends it);
it never blocks (a deque append, no lock) and counts a drop when ``maxsize`` items are waiting,
leaving a loss mark in its place (as :meth:`Recorder.lost` does for a step the profiler lost): the
requests running then miss a step.

A daemon thread wakes every few milliseconds (at the steps' pace, longer while nothing comes:
:class:`Looks`; on a CPU device every 80 ms at least, taking what waits in one go:
:meth:`fit_device`) and drains what is waiting into the aggregator (under ``_lock``) in bounded slices
(``pacing.Pacer``: 0.05-0.2 ms of work, half a percent of the recent decode step, then the GIL
handed to a waiting scheduler thread); a record is taken in stages (its build, then
``Aggregator.stages``: a large batch's record is several), and a record taken in part stays first
in the queue, so a read finishes it before anything else.  Then, outside that lock and in slices
too, it feeds each :class:`~sglang_ctxprof.model.sinks.RecordSink` of :attr:`Recorder.sinks` (OTel,
logs, metrics, capture triggers), each under its own fault-guard component, in submission order,
each sink's turn a piece of its own (a :class:`RequestEnd` goes to the sinks that have an ``end``
at once, a loss mark to those with a ``lost``).  It times each pass over the queue, and each wait for work, as a whole (``cost.Cost``:
this thread's CPU time, so waiting for the GIL while the scheduler thread runs is not counted as
our cost, but a wake-up's own is; a read of it is a system call, so not one per piece).

:meth:`with_aggregator` (a control read, on the scheduler thread) first catches the aggregator up
with the queue, so a snapshot includes every submitted record, but runs no sink: the records it
aggregated wait for the drain thread in a backlog bounded by ``maxsize`` (beyond it the sinks miss
them, counted in ``sink_dropped``), so a stalled sink never delays a read nor the scheduler (a log
pipe has a writer thread of its own; a sink that blocks, e.g. a log file on storage that hangs,
holds the drain thread: a read still catches the aggregator up, but while none comes the queue fills
and later steps are dropped, counted in ``dropped``). :meth:`flush` drains both synchronously;
:meth:`close` stops the thread, drains, and stops each sink. :meth:`park` (profiling switched off at
run time) lets the thread end once it has drained both, so an off profiler runs no drain thread;
:meth:`start` brings it back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, TypeVar, Union

from ..aggregate.aggregator import Aggregator
from ..model.facts import StepFacts
from ..model.records import RequestEnd, StepRecord
from ..model.guard import Guard
from ..model.names import KIND_DECODE
from ..model.sinks import RecordSink
from .cost import Cost
from .pacing import Looks, Pacer, for_device

if TYPE_CHECKING:
    from .host import HostFacts

logger = logging.getLogger(__name__)


class _Lost:
    """A step lost before the aggregator (the queue full, or lost by the profiler: ``Recorder.lost``),
    in its place in the queue: the requests running then miss a step."""

    __slots__ = ()


LOST = _Lost()
# a record; host facts or plain facts, built here in stages; an end; a record taken in part; a loss
Item = Union[StepRecord, "HostFacts", StepFacts, RequestEnd, "_Started", _Lost]
T = TypeVar("T")

THREAD_NAME = "ctxprof-recorder"  # the drain thread's name (benches find its collections by it)
STEP_WEIGHT = 0.25  # a decode record's weight in the recent step (``Recorder.step_ms``)


class _Started:
    """A record the aggregator has taken in part: its remaining stages (``Aggregator.stages``)."""

    __slots__ = ("rec", "stages")

    def __init__(self, rec: StepRecord, stages: Iterator[None]) -> None:
        self.rec = rec
        self.stages = stages

    def step(self) -> bool:
        """Run the next stage; True when the aggregator has taken the whole record."""
        return next(self.stages, _DONE) is _DONE


_DONE = object()


class _Fanning:
    """A record that the first ``next`` sinks have seen (each sink's turn is a piece of its own)."""

    __slots__ = ("rec", "next")

    def __init__(self, rec: StepRecord, next: int) -> None:
        self.rec = rec
        self.next = next


class _Then:
    """A call the sinks' feeder makes once the sinks have seen every record before it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn


Fanned = Union[StepRecord, RequestEnd, _Fanning, _Then, _Lost]  # what waits for the sinks


class Recorder:
    def __init__(self, aggregator: Aggregator, guard: Guard, maxsize: int = 65536,
                 sinks: Iterable[RecordSink] = (), cost: Optional[Cost] = None,
                 pacer: Optional[Pacer[Item]] = None) -> None:
        self.aggregator = aggregator
        self.guard = guard
        self.maxsize = maxsize
        self._q: deque[Item] = deque()
        self._lock = threading.Lock()  # serialises aggregator access (drain thread vs snapshot)
        self.sinks: list[RecordSink] = list(sinks)  # fed in order, after the aggregator
        self._fan: deque[Fanned] = deque()  # aggregated, not yet seen by every sink
        self._sink_lock = threading.Lock()  # one feeder of the sinks at a time (keeps their order)
        self.sink_dropped = 0  # records the sinks never saw: their backlog was full (a stalled sink)
        self.cost = cost if cost is not None else Cost()
        self.pacer: Pacer[Item] = pacer if pacer is not None else Pacer()  # the drain thread's slices
        self.looks = Looks()  # when the drain thread looks for work
        self._paced_by_default = pacer is None  # fit_device may choose them (a given pacer stays)
        self.step_ms = 0.0  # the recent decode step (its records' mean, recent ones weighing most): the slices' size
        self.submitted = 0
        self.dropped = 0
        self._stop: threading.Event | None = None  # the current drain thread's own stop event
        self._thread: threading.Thread | None = None
        self._parked = False  # the drain thread ends once nothing is left (profiling switched off)
        self._life = threading.Lock()  # a parked thread's end against a new start

    # ---- hot path -----------------------------------------------------------------------------
    def submit(self, rec: Item) -> None:
        """Queue a :class:`StepRecord`, or host facts with a ``record()`` method (built when drained)."""
        if not self.guard.ok("recorder"):
            return
        q = self._q
        if len(q) >= self.maxsize:
            self.dropped += 1
            self.lost()  # one mark per run of drops: the queue's only item past maxsize
            return
        q.append(rec)
        self.submitted += 1

    def lost(self) -> None:
        """A step the profiler lost before submitting it (its device times never came, evicted while
        pending, its batch changed under it): the requests running then are marked as missing steps
        (``RequestLog.interrupt``), in queue order, so the self-audit checks them against nothing."""
        if not self._q or self._q[-1] is not LOST:
            self._q.append(LOST)

    def dropped_count(self) -> int:
        return self.dropped

    # ---- drain -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start a drain thread with a stop event of its own: one that ``stop`` told to stop stays
        stopped, even if it outlived the join (a slow pass) and a new one was started since.  A
        parked thread that has not ended yet is un-parked instead: never two."""
        with self._life:
            self._parked = False
            if self._thread is None:
                self._stop = stop = threading.Event()
                self._thread = threading.Thread(target=self._loop, args=(stop,), name=THREAD_NAME,
                                                daemon=True)
                self._thread.start()

    def fit_device(self, device: str, prompt: bool = False) -> None:
        """Pace the drain for where the scheduler's forward runs (``pacing.for_device``; ``prompt``:
        a sink must see each step at once), unless a pacer was given; a running drain thread takes
        them at its next look."""
        if self._paced_by_default:
            self.pacer, self.looks = for_device(device, prompt)

    def park(self) -> None:
        """Let the drain thread end once it has drained the queue and fed the sinks (within one
        idle wait, ``POLL_MAX_S`` at most): profiling switched off runs no thread of ours.  The
        caller (the scheduler thread) neither waits for it nor runs a sink; a read still catches
        the aggregator up.  :meth:`start` brings a thread back."""
        with self._life:
            self._parked = True

    def running(self) -> bool:
        """Whether a drain thread is running (or parked and not ended yet)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _end_parked(self) -> bool:
        """The drain thread's exit when parked and nothing waits: it forgets itself, under the lock
        that ``start`` takes, so a start either un-parks it first or starts a new one after."""
        with self._life:
            if not self._parked or self._q or self._fan:
                return False
            if self._thread is threading.current_thread():
                self._thread = self._stop = None
            return True

    def _loop(self, stop: threading.Event) -> None:
        tt = time.thread_time_ns
        stopped = stop.is_set
        cost = self.cost
        while not stopped():
            t0 = tt()  # one pass, or one wait, timed as a whole (a thread-time read is a system call: ~1 us)
            q, fan, looks = self._q, self._fan, self.looks  # the looks as fit_device last chose them
            if q or fan:
                looks.found(len(q))
                self.pacer.fit(self.step_ms * 1e6)
                if q:
                    self.pacer.drain(q, self._consume, self._lock, stopped)
                self._feed_sinks(stopped)
                cost.pauses = self.pacer.pauses
            elif self._parked and self._end_parked():
                return
            else:
                stop.wait(looks.sleep())
                cost.wakes += 1
            cost.add_drain(tt() - t0, records=0)  # a wake-up's own CPU is the drain's cost too

    def _consume(self, item: Item) -> Optional[Item]:
        """Take one item, or one stage of it: building a record is stages (``HostFacts.build``, then
        ``StepFacts.build``), and the aggregator's (``Aggregator.stages``) are more; an item not done
        yet comes back as its rest (its next stage, or ``_Started``), which goes back to the front of
        the queue (``pacing.Pacer.run_slice``)."""
        if not self.guard.ok("recorder"):
            return None
        kind = type(item)
        if kind is _Lost:
            self.guard.run("aggregator", self.aggregator.interrupt)
            self._to_sinks(item)  # the sinks that measure between steps learn it too (``lost``)
            return None
        if kind is RequestEnd:
            self.guard.run("aggregator", self.aggregator.end_request, item)
            self._to_sinks(item)
            return None
        if kind is _Started:
            started = item
        elif kind is StepRecord:
            started = _Started(item, self.aggregator.stages(item))
        else:  # host or plain facts: one stage of the record's build
            built = self.guard.run("recorder", item.build)
            if built is None:  # no row counted, or a failed build
                self.cost.add_drain(0)
                return None
            if type(built) is not StepRecord:
                return built  # the build's next stage
            return _Started(built, self.aggregator.stages(built))
        if self.guard.run("aggregator", started.step) is False:
            return started
        rec = started.rec
        if rec.kind == KIND_DECODE and rec.step_ms > 0:
            mean = self.step_ms
            self.step_ms = mean + (rec.step_ms - mean) * STEP_WEIGHT if mean else rec.step_ms
        self._to_sinks(rec)
        self.cost.add_drain(0)  # one record taken (its CPU time is counted by the caller's pass)
        return None

    def _to_sinks(self, rec: Union[StepRecord, RequestEnd, _Lost]) -> None:
        if self.sinks:  # the sinks see it later, outside the lock (_feed_sinks)
            fan = self._fan
            if len(fan) < self.maxsize:
                fan.append(rec)
                return
            self.sink_dropped += rec is not LOST  # a record the sinks miss: a loss mark in its place
            if fan[-1] is not LOST:
                fan.append(LOST)

    def _catch_up(self) -> None:
        """Feed the aggregator every waiting item, in order (caller holds ``_lock``)."""
        q = self._q
        if not q:
            return
        t0 = time.thread_time_ns()
        while q:
            rest = self._consume(q.popleft())
            if rest is not None:
                q.appendleft(rest)
        self.cost.add_drain(time.thread_time_ns() - t0, records=0)

    def _feed_sinks(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Feed the sinks what the aggregator took, in the same order, outside the aggregator lock,
        in the pacer's slices (the drain thread hands the GIL over between two) until ``stopped()``."""
        self.pacer.drain(self._fan, self._feed_one, self._sink_lock, stopped)

    def _feed_one(self, item: Fanned) -> Optional[_Fanning]:
        """Feed a record to its next sink; the sinks after it come back as the rest (first in line,
        so each sink sees the records in order).  A request end goes to every sink that has an
        ``end`` at once; a call (:meth:`after_sinks`) is made."""
        if type(item) is _Then:  # run whatever the guard says: a reset's history must be let go of
            try:
                item.fn()
            except Exception:  # noqa: BLE001 - never into the drain
                logger.debug("sglang-ctxprof: a call after the sinks failed", exc_info=True)
            return None
        if type(item) is _Lost:
            for sink in self.sinks:
                lost = getattr(sink, "lost", None)
                if lost is not None:
                    self.guard.run(sink.name, lost)
            return None
        if type(item) is RequestEnd:
            for sink in self.sinks:
                end = getattr(sink, "end", None)
                if end is not None:
                    self.guard.run(sink.name, end, item)
            return None
        sinks = self.sinks
        if type(item) is _Fanning:
            rec, i = item.rec, item.next
        else:
            rec, i = item, 0
        if i < len(sinks):
            sink = sinks[i]
            self.guard.run(sink.name, sink.observe, rec)
        i += 1
        if i >= len(sinks):
            return None
        if type(item) is _Fanning:
            item.next = i
            return item
        return _Fanning(rec, i)

    def flush(self, sink_wait: Optional[float] = None) -> None:
        """Drain everything: the aggregator under the lock, then the sinks outside it.  With
        ``sink_wait`` (seconds), a sink stuck in another thread's call is waited for that long at
        most; its backlog is then left, counted in ``sink_dropped``."""
        with self._lock:
            self._catch_up()
        fan = self._fan
        if not self._sink_lock.acquire(timeout=-1 if sink_wait is None else sink_wait):
            left = sum(type(x) is not _Lost and type(x) is not _Then for x in fan)  # records, not marks
            self.sink_dropped += left
            logger.warning("sglang-ctxprof: a sink is stuck; %d records it has not seen are left", left)
            return
        try:
            if fan:
                t0 = time.thread_time_ns()
                while fan:
                    rest = self._feed_one(fan.popleft())
                    if rest is not None:
                        fan.appendleft(rest)
                self.cost.add_drain(time.thread_time_ns() - t0, records=0)
        finally:
            self._sink_lock.release()

    def with_aggregator(self, fn: Callable[[Aggregator], T]) -> T:
        """Run ``fn(aggregator)`` under the lock once the aggregator has caught up with the queue
        (snapshots, resets).  Sinks are left to the drain thread: a read (on the scheduler thread)
        neither runs a sink nor waits for a stalled one."""
        with self._lock:
            self._catch_up()
            return fn(self.aggregator)

    def after_sinks(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the sinks' feeder once the sinks have seen every record the aggregator has
        taken so far (at once without sinks); never dropped for a full backlog."""
        if self.sinks:
            self._fan.append(_Then(fn))
        else:
            self._feed_one(_Then(fn))

    def read_aggregator(self, fn: Callable[[Aggregator], T]) -> T:
        """Run ``fn(aggregator)`` under the lock as the aggregator is, without catching up: a sink's
        read (the aggregator has taken at least the record the sink is fed), never interleaved with
        a reader's catch-up on the scheduler thread."""
        with self._lock:
            return fn(self.aggregator)

    def stop(self, timeout: float = 2.0) -> None:
        """Tell the drain thread to stop (its own event, never cleared), wait up to ``timeout`` for
        it, forget it, and drain what is left here (waiting ``timeout`` at most for a stuck sink).  A
        thread still inside a slow pass ends with its current slice (the queue is consumed only under
        ``_lock``: never by two threads at once)."""
        with self._life:  # a parked thread may be forgetting itself right now
            stop, thread = self._stop, self._thread
            self._stop = self._thread = None
        if stop is not None:
            stop.set()
        if thread is not None:
            thread.join(timeout)
        self.flush(sink_wait=timeout)  # a sink stuck in the thread's last pass must not hold the stop

    def close(self) -> None:
        """Stop the drain thread, drain what is left, then stop each sink (its threads, providers),
        also one disabled after a failure: what it started must end."""
        self.stop()
        for sink in self.sinks:
            try:
                sink.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
                logger.warning("sglang-ctxprof: sink %r did not stop cleanly: %r", sink.name, exc)
