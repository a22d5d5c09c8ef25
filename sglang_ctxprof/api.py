"""Public API for custom speculative workers: ``with sglang_ctxprof.phase("draft"): ...``.

When no step is being recorded (the hooks' one rule, ``collect.hooks.recording``: profiling off,
timing toggled off, or disabled after a failure of ours), ``phase()`` returns a shared no-op context manager (no allocation, no clock read).  Inside a
recorded step it times the block as the named phase through the same guarded mark pair the hooks
use (``collect.hooks.enter``/``leave``): a failure of our clock disables the ``hooks`` component and
never raises into the caller's worker.  The generic hooks give way to it (the outermost
occurrence of a phase wins, so a declared ``verify`` and the generic verify hook never
double-count).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager, Iterator

from .collect import hooks
from .model.names import DECLARABLE_PHASES, RANGE_PREFIX

if TYPE_CHECKING:
    from .collect.profiler import Profiler
    from .collect.step import StepBuilder

_NULL = contextlib.nullcontext()


def phase(name: str) -> ContextManager[None]:
    if name not in DECLARABLE_PHASES:
        raise ValueError(f"unknown phase {name!r}; declare one of {sorted(DECLARABLE_PHASES)}")
    p = hooks.profiler()
    b = hooks.recording(p)  # the hooks' recording rule: only inside a step run_batch opened
    if p is None or b is None or b.in_phase(name):
        return _NULL
    return _timed(p, b, name)


@contextlib.contextmanager
def _timed(p: Profiler, b: StepBuilder, name: str) -> Iterator[None]:
    t0 = hooks.enter(p, b, hooks.PHASE, name)
    cap = hooks._CAPTURE  # a deep capture runs: the block is a profiler range too
    record_function = hooks._record_function  # set with _CAPTURE; read once, as the capture may end
    rf = record_function(f"{RANGE_PREFIX}{name} {cap.label}") if cap is not None and record_function is not None else _NULL
    try:
        with rf:
            yield
    finally:
        if t0 is not None:
            hooks.leave(p, b, hooks.PHASE, name, t0)
