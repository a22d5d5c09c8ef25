"""Heavy work of the read routes, off SGLang's event loop: one worker thread and a small cache.

SGLang's HTTP process runs the tokenizer manager on the same event loop as our routes, so a
profile built there (Theil-Sen fits, the rank merge) delays every streamed chunk of every request.
:func:`off_loop` runs such work on a single worker thread (``ctxprof-build``): at most one build
at a time, later ones queue behind it.  The event loop only awaits.  :func:`busy_s` sums the
thread's CPU time in these jobs (``http_gate`` keeps it to a share of the time).

:class:`BuildCache` keeps the last few profile builds (the merged profile and each rank's body;
the formats, the diagnosis and the serving envelope are derived fresh from them, cheaply) per the
ranks' versions: the token each rank's state comes with (``version``, which
``collect.profiler.Profiler.state`` defines: it changes whenever the state may).  An answer from
an older rank, without it, is keyed by ``(pid, submitted, records)`` and the device facts instead
(the aggregator changes only by observing a record, when ``records`` and ``submitted`` both grow,
or by a reset, when ``records`` drops while ``submitted`` stays).  An answer with neither is
never cached.  So the live page's two builds per refresh cost one build per change of the data,
however many tabs are open.  A build that does happen refits only the Theil-Sen samples that changed:
the cache owns the memo of recent fits (``fits``, a ``model.stats.FitMemo``) that builds use.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, TypeVar

from ..model.stats import FitMemo

T = TypeVar("T")

_EXEC: Optional[ThreadPoolExecutor] = None
_EXEC_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _EXEC
    with _EXEC_LOCK:
        if _EXEC is None:
            _EXEC = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxprof-build")
        return _EXEC


_BUSY = [0.0]  # the build thread's CPU seconds in jobs, in all (written by that thread only)
_SCHED = [0.0]  # the schedulers' seconds answering reads, in all (written by the event loop only)


def busy_s() -> float:
    """What the reads have cost so far (seconds): the build thread's CPU time in :func:`off_loop`
    jobs, plus the schedulers' time answering them (:func:`charge_schedulers`)."""
    return _BUSY[0] + _SCHED[0]


def charge_schedulers(seconds: float) -> None:
    """A read's time on the schedulers (the longest rank's: they answer at once), from the event loop."""
    _SCHED[0] += max(0.0, seconds)


def _timed(fn: Callable[[], T]) -> T:
    t0 = time.thread_time()
    try:
        return fn()
    finally:
        _BUSY[0] += time.thread_time() - t0


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the build thread; the event loop awaits it (an exception propagates).
    Its CPU time there adds to :func:`busy_s` (what ``http_gate`` bounds)."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), _timed, functools.partial(fn, *args))


def versions(payloads: Sequence[Mapping[str, Any]]) -> Optional[tuple]:
    """The ranks' versions, in answer order, or None when one cannot be told (never cached)."""
    out: list[Hashable] = []
    for p in payloads:
        st, state = p.get("status"), p.get("state")
        if not isinstance(st, Mapping) or not isinstance(state, Mapping):
            return None
        if isinstance(p.get("version"), str):
            out.append(p["version"])
            continue
        try:
            out.append((int(st["pid"]), int(st["submitted"]), int(state["records"]), repr(state.get("hw"))))
        except (KeyError, TypeError, ValueError):
            return None
    return tuple(out)


class BuildCache:
    """The last ``size`` results by key; a key of None is never cached.  Thread-safe: the worker
    thread builds, and two readers of one key may both build once (the later result is kept).
    ``fits``: the recent Theil-Sen fits its builds reuse (a changed state keeps most samples)."""

    def __init__(self, size: int = 8, fits: Optional[FitMemo] = None) -> None:
        self.size = size
        self.fits = fits if fits is not None else FitMemo()
        self._d: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.builds = 0

    def get(self, key: Optional[Hashable], build: Callable[[], T]) -> T:
        if key is not None:
            with self._lock:
                if key in self._d:
                    self._d.move_to_end(key)
                    self.hits += 1
                    return self._d[key]
        out = build()
        with self._lock:
            self.builds += 1
            if key is not None:
                self._d[key] = out
                while len(self._d) > self.size:
                    self._d.popitem(last=False)
        return out

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


CACHE = BuildCache()
