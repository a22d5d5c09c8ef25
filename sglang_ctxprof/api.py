"""Public API for custom speculative workers: ``with sglang_ctxprof.phase("draft"): ...``.

When profiling is off, or no step is being recorded, ``phase()`` returns a shared no-op context
manager (no allocation, no clock read).  Inside a recorded step it times the block on the step's
clock as the named phase; the generic hooks give way to it (the outermost occurrence of a phase
wins, so a declared ``verify`` and the generic verify hook never double-count).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .model.names import DECLARABLE_PHASES

_NULL = contextlib.nullcontext()


def phase(name: str) -> Any:
    if name not in DECLARABLE_PHASES:
        raise ValueError(f"unknown phase {name!r}; declare one of {sorted(DECLARABLE_PHASES)}")
    from .collect import hooks

    p = hooks.PROFILER
    if p is None or not p.active:
        return _NULL
    b = p.current()
    if b is None or b.in_phase(name):
        return _NULL
    return _timed(p, b, name)


@contextlib.contextmanager
def _timed(p: Any, b: Any, name: str) -> Iterator[None]:
    t0 = p.clock.mark()
    b.open.append(name)
    try:
        yield
    finally:
        b.open.pop()
        b.add(name, t0, p.clock.mark())
