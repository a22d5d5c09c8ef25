"""A bound on how much of SGLang's HTTP process the read routes take, and shared replies.

A read (``/ctx_profile``, ``/diagnosis``, ``/requests``, ``/trace.json``, a capture's timeline)
asks the schedulers and then builds its reply on the build thread (``http_build``).  That thread
shares the GIL with SGLang's event loop, which also streams every response, so a loop of reads
back to back would hold the GIL for much of the time and delay every streamed chunk.

:class:`ReadGate` runs each read (its control round trip and its build) so that its cost stays at
most ``share`` of the time: after a read that took ``c`` seconds of the build thread's CPU and of the
schedulers' (the longest rank's answer, ``http_build.busy_s``), the next one starts no earlier than
``c * (1 - share) / share`` seconds after it ended.  A read arriving during that cool-down waits for it asynchronously (the event loop keeps
serving), then asks and builds anew, so a reply is never older than its request.  Readers of the
same route and query that arrive while one such read is waiting to start share it (one build, the
same reply); if the reader whose run they share hangs up, they ask anew, never cancelled with it.
Reads run one at a time, as the one build thread would run them anyway.

At most ``limit`` distinct reads (:data:`MAX_WAITING` by default) wait to start at a time: a reader
whose route and query differ from every waiting one while that many wait is refused at once
(:class:`GateFull`; :meth:`ReadGate.serve` answers it as a 429 JSON error with ``retry_after_s`` and
a ``Retry-After`` header), so one client sending many distinct queries (``/diagnosis?ctx=N``, one
per N) delays any other read by at most ``limit`` builds and their cool-downs, never indefinitely.
A reader of a key already waiting shares that read and takes no place, so the live page's few
periodic reads (any number of open pages) never fill the queue by themselves.  The hint is an
estimate: the cool-down left plus, per waiting read, the last read's time and cool-down.

A few reads are *standing* (the caller says which: a small fixed set, such as the live page's
reads and a scraper's ``/ctx_profile``): one of them is admitted even when ``limit`` other reads
wait and takes no place among them.  Standing and other reads take turns: after an other read's
turn, the first standing read waiting goes next, and after a standing read's, the first other one.
So a client that keeps the queue full delays a dashboard or a scrape by one other read per standing
read ahead of it (at most one per standing key, since a standing read is shared like any other),
not by ``limit`` of them, and never has it refused; and scrapers polling back to back delay an
other read by one standing read per turn, never indefinitely.  The queue holds at most ``limit``
plus the standing keys.

``share`` is ``CtxProfConfig.read_share`` (``SGLANG_CTXPROF_READ_SHARE``, default 0.1); ``1``
disables the cool-down.  On an idle server a read starts at once.  The clock, the sleep and the
meter of the build thread's busy time are injected (tests use fakes).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Any, Awaitable, Callable, Hashable, Optional, TypeVar

from .http_build import busy_s
from .http_guard import error

T = TypeVar("T")
MAX_WAITING = 16  # distinct reads that may wait to start at once
MIN_RETRY_S = 1.0  # the least retry hint a refused reader is given


class GateFull(Exception):
    """A read refused because ``waiting`` distinct reads already wait; try again in ``retry_after_s``."""

    def __init__(self, waiting: int, retry_after_s: float) -> None:
        super().__init__(f"{waiting} distinct reads are waiting; try again in {retry_after_s:.1f} s")
        self.waiting, self.retry_after_s = waiting, retry_after_s


class _Gone(Exception):
    """A run whose own reader was cancelled (it hung up): its sharers ask anew."""


class ReadGate:
    def __init__(self, share: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 meter: Callable[[], float] = busy_s, limit: int = MAX_WAITING) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"read share must be in (0, 1], got {share!r}")
        if limit < 1:
            raise ValueError(f"at least one read must be let wait, got a limit of {limit!r}")
        self.share, self.limit = share, limit
        self._clock, self._sleep, self._meter = clock, sleep, meter
        self._ready_at = 0.0  # the earliest start of the next read's work
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._busy = False  # a read holds the turn (its cool-down wait, its work)
        self._standing_turn = False  # the read holding the turn is a standing one
        self._lines: tuple[deque[asyncio.Future], deque[asyncio.Future]] = (deque(), deque())  # standing, others
        self._waiting: dict[Hashable, tuple[asyncio.Future, bool]] = {}  # per key: the read not yet started, standing
        self.runs = 0  # reads that asked and built
        self.shared = 0  # readers served by another reader's run
        self.waited_s = 0.0  # cool-down slept, in all
        self.refused = 0  # readers refused because ``limit`` distinct reads were waiting
        self._last_s = 0.0  # the last read's time and cool-down (for the retry hint)

    def cooldown(self, cost_s: float) -> float:
        """Seconds to rest after work that kept the build thread busy ``cost_s`` seconds."""
        return max(0.0, cost_s) * (1.0 - self.share) / self.share

    async def run(self, key: Hashable, work: Callable[[], Awaitable[T]], standing: bool = False) -> T:
        """``await work()``, within the share; a reader of ``key`` arriving while a run of ``key``
        waits to start gets that run's result (or its exception).  Raises :class:`GateFull` when
        ``limit`` reads of other keys wait to start, unless this read is ``standing`` (admitted
        anyway; standing and other reads take turns, :meth:`_release`)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._busy, self._standing_turn, self._waiting = loop, False, False, {}
            self._lines = (deque(), deque())
        pending = self._waiting.get(key)
        while pending is not None:
            self.shared += 1
            try:
                return await asyncio.shield(pending[0])
            except _Gone:  # the run's own reader hung up: this one did not, so it asks anew
                self.shared -= 1
                pending = self._waiting.get(key)
        if not standing and self.others_waiting() >= self.limit:
            self.refused += 1
            raise GateFull(len(self._waiting), self.retry_after_s())
        fut: asyncio.Future = loop.create_future()
        self._waiting[key] = (fut, standing)
        try:
            result = await self._turn(key, work, standing)
        except BaseException as exc:  # noqa: BLE001 - handed to the sharers, then raised here
            if self._waiting.get(key, (None,))[0] is fut:
                del self._waiting[key]
            fut.set_exception(_Gone() if isinstance(exc, asyncio.CancelledError) else exc)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody shared
            raise
        fut.set_result(result)
        return result

    async def serve(self, key: Hashable, work: Callable[[], Awaitable[T]], standing: bool = False) -> Any:
        """:meth:`run`, with a full queue answered as a 429 JSON error (``retry_after_s``, and a
        ``Retry-After`` header in whole seconds)."""
        try:
            return await self.run(key, work, standing)
        except GateFull as full:
            reply = error(429, str(full), retry_after_s=round(full.retry_after_s, 3))
            reply.headers["Retry-After"] = str(math.ceil(full.retry_after_s))
            return reply

    def retry_after_s(self) -> float:
        """About when the reads waiting now will have run (at least :data:`MIN_RETRY_S`)."""
        left = max(0.0, self._ready_at - self._clock()) + len(self._waiting) * self._last_s
        return max(MIN_RETRY_S, left)

    def others_waiting(self) -> int:
        """Reads waiting to start that are not standing (the ones ``limit`` bounds)."""
        return sum(1 for _, standing in self._waiting.values() if not standing)

    async def _acquire(self, standing: bool) -> None:
        """Take the turn: at once when free, else when :meth:`_release` hands it to this read (in its
        line, standing or other, after every read of that line that came before)."""
        if not self._busy:
            self._busy, self._standing_turn = True, standing
            return
        assert self._loop is not None
        fut: asyncio.Future = self._loop.create_future()
        line = self._lines[0 if standing else 1]
        line.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # handed the turn as it was cancelled: hand it on
            elif fut in line:
                line.remove(fut)
            raise

    def _release(self) -> None:
        """Hand the turn on: to the first read waiting in the line whose turn it is (standing after an
        other read, other after a standing one), else to the first in the other line."""
        standing, others = self._lines
        for line in ((others, standing) if self._standing_turn else (standing, others)):
            while line:
                fut = line.popleft()
                if not fut.done():
                    self._standing_turn = line is standing
                    fut.set_result(None)
                    return
        self._busy = False

    async def _turn(self, key: Hashable, work: Callable[[], Awaitable[T]], standing: bool) -> T:
        await self._acquire(standing)
        try:
            while True:
                wait = self._ready_at - self._clock()
                if wait <= 0:
                    break
                self.waited_s += wait
                await self._sleep(wait)
            if self._waiting.get(key) is not None:
                del self._waiting[key]  # from now on a reader of key needs a newer run
            busy0, t0 = self._meter(), self._clock()
            try:
                return await work()
            finally:
                self.runs += 1
                rest = self.cooldown(self._meter() - busy0)
                self._ready_at = self._clock() + rest
                self._last_s = self._ready_at - t0
        finally:
            self._release()


_GATE: Optional[ReadGate] = None


def gate() -> ReadGate:
    """The HTTP process's one gate, with the configured share (made on first use)."""
    global _GATE
    if _GATE is None:
        from ..model.config import CtxProfConfig

        _GATE = ReadGate(CtxProfConfig.from_env().read_share)
    return _GATE
