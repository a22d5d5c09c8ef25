"""Interval clocks: a monotonic CPU clock (the wall clock, or the scheduler thread's own CPU time:
:func:`cpu_clock`) and a CUDA-event clock, behind one interface.

``mark()`` returns an opaque token taken "now" (on the CPU, or on the current CUDA stream);
``elapsed_ms(a, b)`` returns the time between two tokens, or ``None`` if the device has not
reached ``b`` yet.  The CUDA clock never synchronizes: it asks ``Event.query()`` and the caller
retries later (both events are asked: a pair may span two streams).  SGLang reads step results only after its own ``copy_done.synchronize()``, which
waited for every kernel of the step, so in practice the first read succeeds.

``release(token)`` returns CUDA events to a bounded pool, so steady state allocates nothing.
The event class is injectable so the CUDA logic is unit-tested on machines without a GPU
(``fake_cuda.FakeDevice``).

If a step's events are not complete when its result is processed (``query()`` is False), the
step is *parked* in a bounded :class:`Parked` queue and retried at the next result, not dropped;
only an overflow of that queue loses a step (counted).  :func:`make_graph_timer` builds the
CUDA-graph block timer (``graph_clock.GraphTimer``) with the real ``torch.cuda`` pieces.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Protocol, TypeVar

from ..model.config import GraphSettings
from ..model.names import CLOCK_THREAD, CLOCK_WALL, CLOCKS, TIMING_CPU, TIMING_CPU_THREAD, TIMING_CUDA_EVENTS

if TYPE_CHECKING:
    from .graph_clock import GraphTimer


Token = Any  # a clock's opaque mark: an int on the CPU clock, a torch.cuda.Event on CUDA


class Clock(Protocol):
    """What the profiler marks intervals with."""

    mode: str

    def mark(self) -> Token: ...

    def elapsed_ms(self, a: Token, b: Token) -> Optional[float]: ...

    def release(self, token: Token) -> None: ...


class CpuClock:
    """Monotonic nanoseconds from ``now`` (default ``time.perf_counter_ns``; a test passes a fake).
    ``mode`` labels the records (``cpu``: wall clock; ``cpu_thread``: :func:`cpu_clock` ``thread``)."""

    mode = TIMING_CPU

    def __init__(self, now: Callable[[], int] = time.perf_counter_ns, mode: str = TIMING_CPU) -> None:
        self.mark = now  # the hot path calls the clock function itself: no extra frame
        self.mode = mode

    @staticmethod
    def elapsed_ms(a: int, b: int) -> Optional[float]:
        return (b - a) / 1e6

    @staticmethod
    def release(token: Any) -> None:
        return None


class CudaEventClock:
    """CUDA events on the current stream; resolved with ``query()``, never ``synchronize()``."""

    mode = TIMING_CUDA_EVENTS

    def __init__(self, event_factory: Callable[[], Any] | None = None, pool_size: int = 4096) -> None:
        if event_factory is None:
            import torch  # only when a CUDA clock is actually built

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

        self._factory = event_factory
        self._pool: list[Any] = []
        self._pool_size = pool_size
        self.created = 0

    def mark(self) -> Any:
        ev = self._pool.pop() if self._pool else None
        if ev is None:
            ev = self._factory()
            self.created += 1
        ev.record()
        return ev

    @staticmethod
    def elapsed_ms(a: Any, b: Any) -> Optional[float]:
        # Both: a pair may span two streams (a phase opened on one stream and closed on another),
        # and ``elapsed_time`` raises unless both events completed.
        if not (a.query() and b.query()):
            return None
        return float(a.elapsed_time(b))

    def release(self, token: Any) -> None:
        if len(self._pool) < self._pool_size:
            self._pool.append(token)


def cpu_clock(name: str = CLOCK_WALL) -> CpuClock:
    """The CPU clock named ``name`` (``names.CLOCKS``): ``wall`` reads ``perf_counter_ns``; ``thread``
    reads ``thread_time_ns``, the calling thread's own CPU time.  Every mark of a CPU step is taken on
    the scheduler's forward thread, so on the thread clock a step and each of its phases are that
    thread's CPU time: time the OS gave to other processes, and GIL waits, are left out.  With
    ``OMP_NUM_THREADS=1`` that thread runs all of the step's kernels (with more OpenMP threads their
    work would be missed), so on a shared machine the phases read the kernels' own cost."""
    if name == CLOCK_THREAD:
        return CpuClock(time.thread_time_ns, TIMING_CPU_THREAD)
    if name != CLOCK_WALL:
        raise ValueError(f"unknown clock {name!r}: use one of {', '.join(CLOCKS)}")
    return CpuClock()


def make_clock(device: str | None, cpu: str = CLOCK_WALL) -> Clock:
    """CUDA events when the model runs on a CUDA device, else the CPU clock named ``cpu``."""
    if device and str(device).startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                return CudaEventClock()
        except Exception:  # noqa: BLE001 - fall back to CPU timing, never break start-up
            pass
    return cpu_clock(cpu)


def make_graph_timer(device: str | None, settings: Optional[GraphSettings] = None) -> "Optional[GraphTimer]":
    """A GraphTimer on CUDA (``external=`` feature-detected), None elsewhere."""
    settings = settings or GraphSettings()
    if not (device and str(device).startswith("cuda")):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from .graph_clock import GraphTimer, external_event_factory

        factory, reason = external_event_factory(torch.cuda.Event)
        return GraphTimer(factory, torch.cuda.is_current_stream_capturing, sample_every=settings.sample_every,
                          fallback=settings.fallback, reason=reason, timed_shapes=settings.timed_shapes,
                          memory=torch.cuda.memory_reserved)
    except Exception:  # noqa: BLE001 - the split becomes unavailable, start-up goes on
        return None


T = TypeVar("T")


class Parked(Generic[T]):
    """Bounded FIFO of steps whose device times are not ready yet; retried, never waited on."""

    def __init__(self, maxlen: int = 256) -> None:
        self._q: deque[T] = deque()
        self.maxlen = maxlen
        self.parked = 0
        self.lost = 0

    def __len__(self) -> int:
        return len(self._q)

    def push(self, item: T, on_evict: Callable[[T], None]) -> None:
        self._q.append(item)
        self.parked += 1
        while len(self._q) > self.maxlen:
            self.lost += 1
            on_evict(self._q.popleft())

    def clear(self, on_drop: Callable[[T], None]) -> None:
        """Forget every parked item, oldest first, each through ``on_drop``."""
        while self._q:
            on_drop(self._q.popleft())

    def retry(self, try_finish: Callable[[T], bool]) -> int:
        """Call ``try_finish(item)`` oldest first; stop at the first not ready (stream order)."""
        done = 0
        while self._q and try_finish(self._q[0]):
            self._q.popleft()
            done += 1
        return done
