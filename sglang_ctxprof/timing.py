"""Interval clocks: a monotonic CPU clock and a CUDA-event clock, behind one interface.

``mark()`` returns an opaque token taken "now" (on the CPU, or on the current CUDA stream);
``elapsed_ms(a, b)`` returns the time between two tokens, or ``None`` if the device has not
reached ``b`` yet.  The CUDA clock never synchronizes: it asks ``Event.query()`` and the caller
retries later.  SGLang reads step results only after its own ``copy_done.synchronize()``, which
waited for every kernel of the step, so in practice the first read succeeds.

``release(token)`` returns CUDA events to a bounded pool, so steady state allocates nothing.
The event class is injectable so the CUDA logic is unit-tested on machines without a GPU.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .names import TIMING_CPU, TIMING_CUDA_EVENTS


class CpuClock:
    mode = TIMING_CPU

    @staticmethod
    def mark() -> int:
        return time.perf_counter_ns()

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
        if not b.query():
            return None
        return float(a.elapsed_time(b))

    def release(self, token: Any) -> None:
        if len(self._pool) < self._pool_size:
            self._pool.append(token)


def make_clock(device: str | None) -> Any:
    """CUDA events when the model runs on a CUDA device, else the monotonic CPU clock."""
    if device and str(device).startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                return CudaEventClock()
        except Exception:  # noqa: BLE001 - fall back to CPU timing, never break start-up
            pass
    return CpuClock()
