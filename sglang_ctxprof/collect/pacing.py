"""How the recorder's drain thread shares the GIL with the scheduler thread: bounded slices of work
(:class:`Pacer`), and looks for work at the pace of the steps (:class:`Looks`).

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

Where the forward runs on the CPU (``--device cpu``: :func:`for_device`) none of that pays: the
scheduler thread holds the GIL for all but the inside of each torch op, and its forward passes
through the same caches, so the drain's working set is cold at every look (a record costs ~4x its
warm CPU after 64 MB of other work, ``bench/drain_cold.py``) and again after every pause.  There
the drain looks every ``CPU_LOOK_S`` (80 ms) at least and takes what it finds in one go: the
records of several steps for one warm-up of their working set, and no hand-over between pieces
(slices of ``CPU_SLICE_NS`` with no pause between them: a stop is still seen between two); with
the automatic capture triggers on, it looks at the steps' pace (a trigger must see a slow step
within a step or two).  On a real CPU server at batch 1 that halved the drain's CPU per record and
left most steps with no wait at all; the step that takes a look waits about as long as a paced
drain's p99 step, within the machine's noise (``bench/drain_server.py --arms paced,batched``,
three runs).

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
POLL_S = 0.005  # the shortest sleep after a pass before the drain thread looks at the queue again
POLL_BUSY_MAX_S = 0.05  # the longest: how long a record may wait for the drain while steps come
POLL_MAX_S = 0.1  # each look that finds nothing doubles the sleep, up to this (an idle server)
MANY = 4  # items found by the first look after a pass from which the first sleep halves
CPU_LOOK_S = 0.08  # a CPU device's drain: the shortest sleep between two looks (several steps' records)
CPU_SLICE_NS = 5_000_000  # its slices (no pause between two): a stop is seen within one (5 ms)

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
        waiting, unless more than ``backlog`` do (or ``pause_s`` is 0: no pauses).  Returns how many
        items were consumed."""
        n = 0
        while q and not stop():
            n += self.run_slice(q, consume, lock)
            if q and self.pause_s and len(q) <= self.backlog:
                self.pauses += 1
                self.sleep(self.pause_s)
        return n



class Looks:
    """When the drain thread looks at the queue.  A wake-up costs the thread its GIL and a system
    call or two (25 µs of CPU alone on a 2-core VM, ~120 µs while the scheduler thread runs Python),
    so it should find about one record, or a few: not none.

    After a pass the thread sleeps ``first``; each look that finds nothing doubles the sleep, up to
    ``most`` (an idle server wakes ~10 times a second, not 200).  ``first`` follows the pace of the
    steps: it doubles (up to ``busy_most``) when its look found nothing and a later one found work,
    and halves (down to ``base``) when its look found ``many`` items or more.  At one step every
    20 ms a fixed 5 ms first sleep wakes twice per record (the 5 and 10 ms looks find nothing), and
    3.6 times at one every 60 ms; this wakes about once, and a record waits at most ``busy_most``
    (plus a look's miss) while steps come.  Drain thread only."""

    __slots__ = ("base", "busy_most", "most", "many", "first", "wait", "slept")

    def __init__(self, base: float = POLL_S, busy_most: float = POLL_BUSY_MAX_S, most: float = POLL_MAX_S,
                 many: int = MANY) -> None:
        self.base, self.busy_most, self.most, self.many = base, busy_most, most, many
        self.first = self.wait = base
        self.slept = 0  # sleeps since the last pass

    def sleep(self) -> float:
        """The next sleep, the queue being empty."""
        wait = self.wait
        self.wait = min(self.most, wait * 2)
        self.slept += 1
        return wait

    def found(self, n: int) -> None:
        """A look found ``n`` items waiting (a pass follows): adapt ``first`` to the pace seen."""
        if self.slept > 1:  # the first sleep was too short to find the next record
            self.first = min(self.busy_most, self.first * 2)
        elif self.slept == 1 and n >= self.many:  # ... or so long that records piled up
            self.first = max(self.base, self.first / 2)
        self.wait = self.first
        self.slept = 0


def for_device(device: str, prompt: bool = False) -> tuple[Pacer, Looks]:
    """The drain's pacer and looks where the scheduler's forward runs on ``device`` (SGLang's
    ``--device``): paced slices and looks at the steps' pace on an accelerator, whole looks every
    ``CPU_LOOK_S`` at least on the CPU; ``prompt`` (a sink must see each step at once: the
    automatic capture triggers, which start a capture a step or two after a slow one) keeps the
    looks at the steps' pace there too."""
    if device == "cpu":
        looks = Looks() if prompt else Looks(CPU_LOOK_S, CPU_LOOK_S, max(POLL_MAX_S, CPU_LOOK_S))
        return Pacer(slice_ns=CPU_SLICE_NS, slice_max_ns=CPU_SLICE_NS, pause_s=0.0), looks
    return Pacer(), Looks()
