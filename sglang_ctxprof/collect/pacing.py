"""How the recorder's drain thread shares the GIL with the scheduler thread: bounded slices of work.

The drain thread and the scheduler thread share one GIL.  The scheduler thread gives it up at
every torch op, CUDA synchronize or launch, and must take it back afterwards; a thread that holds
it in pure Python keeps it until it blocks or until the interpreter's switch interval (5 ms by
default) forces a hand-over.  A drain that builds and aggregates a whole queue of records in one
go therefore delays the scheduler's next step by up to that interval each time it wants the GIL back.

:class:`Pacer` cuts the drain into slices: under the recorder's lock it consumes queued items, one
at a time and in order, until a slice of its clock has passed (at least one item per slice),
(an item may be consumed in stages: ``consume`` then returns the item's rest, which goes back to
the front of the queue), then releases the lock and sleeps ``pause_s`` (``time.sleep`` releases the GIL; a thread waiting
for it is woken and takes it before the drain thread wakes again), and goes on while items are
waiting.  A sleep of 0 would not do: the releasing thread takes the GIL straight back before a
waiting thread has woken.  The scheduler thread then waits at most one slice (or one item, if an
item takes longer) instead of up to a switch interval.

How long a slice runs follows the step (:meth:`Pacer.fit`): ``share`` of the recent decode step
(half the 1% the drain may delay a step by), never under ``slice_ns`` nor over ``slice_max_ns``.
A pause is a GIL hand-over that costs the drain thread 20-70 µs of CPU (a 2-core VM), so at one
step every 20 ms, 0.1 ms slices take half the pauses of 0.05 ms ones for the same bound on the
scheduler's wait as a share of its step; CPU-bound steps of a few ms keep 0.05 ms.

The drain must keep up: when more than ``backlog`` items wait (the scheduler produces faster than
paced slices consume, e.g. on a loaded host where every sleep costs the drain thread a trip through
the OS scheduler), slices run back to back without the pause until the queue is back under it, so
pacing never turns into dropped records, nor into a long catch-up for a reader's flush (which a
control command runs on the scheduler thread itself).  Readers (``Recorder.flush``) still drain everything at
once, on their own thread.  Clock and sleep are injectable (tests); ``slices`` and ``pauses``
count what the drain thread did.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")

SLICE_NS = 50_000  # the shortest slice of drain work between two hand-overs of the GIL (0.05 ms)
SLICE_MAX_NS = 200_000  # the longest (0.2 ms: a 40 ms step's share)
SLICE_SHARE = 0.005  # of the recent decode step: one slice delays the scheduler by at most this
PAUSE_S = 50e-6  # the hand-over: a sleep long enough for a waiting thread to wake and take the GIL
BACKLOG = 16  # items waiting beyond which slices run without the pause (the drain must keep up)


class Pacer(Generic[T]):
    __slots__ = ("slice_ns", "slice_max_ns", "share", "current_ns", "pause_s", "backlog", "clock", "sleep",
                 "slices", "pauses")

    def __init__(self, slice_ns: int = SLICE_NS, pause_s: float = PAUSE_S, backlog: int = BACKLOG,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 sleep: Callable[[float], None] = time.sleep, slice_max_ns: int = SLICE_MAX_NS,
                 share: float = SLICE_SHARE) -> None:
        self.slice_ns = slice_ns
        self.slice_max_ns = max(slice_ns, slice_max_ns)
        self.share = share
        self.current_ns = slice_ns  # the slice as long as the step allows (fit)
        self.pause_s = pause_s
        self.backlog = backlog
        self.clock = clock
        self.sleep = sleep
        self.slices = 0
        self.pauses = 0

    def fit(self, step_ns: float) -> None:
        """Size the slices to a step of ``step_ns``: ``share`` of it, within ``slice_ns`` and
        ``slice_max_ns`` (an unknown step, 0, gives the shortest)."""
        self.current_ns = min(self.slice_max_ns, max(self.slice_ns, int(step_ns * self.share)))

    def run_slice(self, q: deque[T], consume: Callable[[T], Optional[T]], lock: threading.Lock) -> int:
        """Consume items from the left of ``q`` in order, under ``lock``, until ``current_ns`` have
        passed or ``q`` is empty (at least one item when any waits).  An item that ``consume`` has
        taken only in part comes back as its rest, which goes back to the left of ``q`` (first in
        line, before the next slice or a reader's catch-up).  Returns how many were consumed."""
        n = 0
        clock = self.clock
        with lock:
            end = clock() + self.current_ns
            while q:
                rest = consume(q.popleft())
                if rest is not None:
                    q.appendleft(rest)
                n += 1
                if clock() >= end:
                    break
        self.slices += 1
        return n

    def drain(self, q: deque[T], consume: Callable[[T], Optional[T]], lock: threading.Lock,
              stop: Callable[[], bool] = lambda: False) -> int:
        """Slices until ``q`` is empty (or ``stop()``), a pause after each slice that left items
        waiting, unless more than ``backlog`` do.  Returns how many items were consumed."""
        n = 0
        while q and not stop():
            n += self.run_slice(q, consume, lock)
            if q and len(q) <= self.backlog:
                self.pauses += 1
                self.sleep(self.pause_s)
        return n
