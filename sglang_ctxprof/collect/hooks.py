"""Thin hook functions.  Each calls SGLang's original exactly once, outside any guard.

Our own work before and after the original runs inside ``try`` blocks that report to the
profiler's :class:`~sglang_ctxprof.model.guard.Guard`; a failure disables the ``hooks`` component
and SGLang continues as if we were not there.  Nothing here synchronizes a device or reads a GPU
tensor: marks come from the profiler's clock, and results are read in ``process_batch_result``
after SGLang's own ``copy_done.synchronize()``.

``SESSION`` is the one handle: the process's
:class:`~sglang_ctxprof.collect.session.CtxProfSession`, set and cleared only by its
``instrument()``/``uninstrument()``; ``None`` means off.

**The recording rule** (:func:`recording`, the one check every timing hook and ``phase()`` make):
a hook records only into the current step's :class:`~sglang_ctxprof.collect.step.StepBuilder`,
which exists from ``run_batch``'s ``begin_step`` to its ``end_step`` on the scheduler thread, and
``run_batch`` opens one only while timing is on and the ``hooks`` component is healthy; a failure
of our hook code drops it (:func:`_fail`).  No builder:
the hook calls SGLang's original and nothing else.  What a hook checks after that is *where* its
region goes (which phase, outermost wins, decode only...), not whether to record.  Every timed region (the step span, the
phases, the attention/MoE regions, and ``sglang_ctxprof.phase()`` blocks) goes through one guarded
mark -> call -> mark pair: :func:`enter` and :func:`leave`.

While a deep capture runs (``collect/capture``), :func:`label_phases` swaps :func:`_around` for a
version that also opens each region as a ``torch.profiler.record_function`` range; otherwise the
hooks run exactly the plain code.  ``run_batch`` ticks an armed capture on every step, also when
the timing hooks are off after a failure of this rank: SGLang's profiler stops with a barrier across
the TP group, so every rank must start and stop it at the same steps.

On the steps the profiler times (``collect/cost``), each hook adds the time of its own code to the
step's ``cost_ns``, and the ``process_batch_result`` hook books the step's total.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Callable, ContextManager, Optional

from ..model.names import KIND_DECODE, RANGE_PREFIX, Phase
from ..control.protocol import is_control_rid
from . import adapter

if TYPE_CHECKING:  # types only: session and profiler import this module at run time
    from .capture import Capture
    from .clocks import Token
    from .profiler import Profiler
    from .session import CtxProfSession
    from .step import StepBuilder

SESSION: Optional[CtxProfSession] = None  # the CtxProfSession of this process (set only by it)

_VERIFY = Phase.VERIFY.value
_DRAFT = Phase.DRAFT.value
_DECODE = Phase.DECODE.value

# What a timed region writes into the step: the step span, a phase, or a region inside verify.
SPAN, PHASE, SUB = 0, 1, 2

_now = time.perf_counter_ns  # monotonic: our own cost on timed steps


def _never() -> bool:
    return False


# Block hooks step aside while torch.compile traces (dynamo folds this check to a constant), so a
# compiled region never contains our Python.  Resolved when a session instruments (torch is loaded
# by then wherever SGLang runs), not at import, so import order does not matter.
IS_COMPILING = _never


def resolve_compiling() -> None:
    global IS_COMPILING
    torch = sys.modules.get("torch")
    IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never


def profiler() -> Optional[Profiler]:
    """The profiler behind the handle, or None when no session is instrumented."""
    s = SESSION
    return s.profiler if s is not None else None


def recording(p: Optional[Profiler]) -> Optional[StepBuilder]:
    """The step being recorded on this thread, or None: pass through (the rule in the docstring)."""
    return p.current() if p is not None else None


def _fail(p: Profiler, exc: BaseException) -> None:
    """Disable the ``hooks`` component and stop recording the current step at once (the rule)."""
    p.guard.fail("hooks", exc)
    p.tls.step = None


def enter(p: Profiler, b: StepBuilder, kind: int, name: str) -> Optional[Token]:
    """Open a timed region of step ``b``: its start mark, or None if our code failed (guarded)."""
    try:
        t0 = p.clock.mark()
        if kind == PHASE:
            b.open.append(name)
        elif kind == SUB:
            b.sub_depth += 1
        return t0
    except Exception as exc:  # noqa: BLE001
        _fail(p, exc)
        return None


def leave(p: Profiler, b: StepBuilder, kind: int, name: str, t0: Token) -> None:
    """Close the region opened by :func:`enter` (guarded)."""
    try:
        t1 = p.clock.mark()
        if kind == SPAN:
            b.span = (t0, t1)
            return
        if kind == PHASE:
            b.open.pop()
        else:
            b.sub_depth -= 1
        b.marks.append((name, t0, t1))
    except Exception as exc:  # noqa: BLE001
        _fail(p, exc)


def _around(p: Profiler, b: StepBuilder, kind: int, name: str, original, args, kwargs):
    if b.cost_ns >= 0:
        return _around_timed(p, b, kind, name, original, args, kwargs)
    t0 = enter(p, b, kind, name)
    if t0 is None:
        return original(*args, **kwargs)
    try:
        return original(*args, **kwargs)
    finally:
        leave(p, b, kind, name, t0)


def _around_timed(p: Profiler, b: StepBuilder, kind: int, name: str, original, args, kwargs):
    """:func:`_around` on a timed step: also adds the time of our marks to ``b.cost_ns``."""
    t = _now()
    t0 = enter(p, b, kind, name)
    b.cost_ns += _now() - t
    if t0 is None:
        return original(*args, **kwargs)
    try:
        return original(*args, **kwargs)
    finally:
        t = _now()
        leave(p, b, kind, name, t0)
        b.cost_ns += _now() - t


_around_plain = _around
_CAPTURE: Optional[Capture] = None  # while a deep capture runs
_record_function: Optional[Callable[[str], ContextManager[object]]] = None  # torch.profiler.record_function then


def _around_labelled(p: Profiler, b: StepBuilder, kind: int, name: str, original, args, kwargs):
    """:func:`_around` inside a ``torch.profiler.record_function`` range named after the phase, the
    step and its context: every op the profiler records in it sits under our phase."""
    record_function, capture = _record_function, _CAPTURE
    if record_function is None or capture is None:  # the capture ended between the two reads
        return _around_plain(p, b, kind, name, original, args, kwargs)
    with record_function(f"{RANGE_PREFIX}{name or 'step'} {capture.label}"):
        return _around_plain(p, b, kind, name, original, args, kwargs)


def label_phases(capture: Optional[Capture]) -> None:
    """Open every timed region as a profiler range while ``capture`` runs; ``None`` puts the plain
    path back (the hooks look ``_around`` up at each call, so off costs nothing)."""
    global _around, _CAPTURE, _record_function
    if capture is None:
        _around, _CAPTURE = _around_plain, None
        return
    import torch

    _record_function, _CAPTURE = torch.profiler.record_function, capture
    _around = _around_labelled


def run_batch(original, self, batch, *args, **kwargs):
    s = SESSION
    p = s.profiler if s is not None else None
    b = None
    if p is not None:
        p.step_source = self  # the graph replay rule's step counter, whatever else happens
        if p.active:  # bound at the first step (then at once), even with the hooks broken from it
            try:  # on: the exporters (the live degraded gauge) exist to say so
                p.bind(self)
            except Exception as exc:  # noqa: BLE001
                _fail(p, exc)
    if p is not None and p.active and p.guard.ok("hooks"):
        t = _now()
        try:
            b = p.begin_step(self, batch)
            worker = getattr(self, "model_worker", None)
            if b is not None and worker is not None and p.wrapped_worker is not worker:
                s.wrap_worker(worker)
        except Exception as exc:  # noqa: BLE001
            _fail(p, exc)
            b = None
        if b is not None and b.cost_ns >= 0:
            b.cost_ns += _now() - t
    if p is not None and p.capture.armed:  # every rank alike, healthy timing hooks or not (a barrier)
        p.capture.tick(self, batch)  # never raises (Capture.tick handles its own failures)
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        if b is not None:
            t = _now()
            try:
                p.end_step(b, batch)
            except Exception as exc:  # noqa: BLE001
                _fail(p, exc)
            if b.cost_ns >= 0:
                b.cost_ns += _now() - t


def step_span(original, *args, **kwargs):
    """Instance wrapper of the (speculative) worker's forward_batch_generation: the step span."""
    p = profiler()
    b = recording(p)
    if b is None or b.span is not None:
        return original(*args, **kwargs)
    return _around(p, b, SPAN, "", original, args, kwargs)


def process_batch_result(original, self, batch, result, *args, **kwargs):
    p = profiler()
    b = None
    if p is not None and p.guard.ok("hooks") and p.pending:
        t = _now()
        try:
            b = p.before_result(batch)
        except Exception as exc:  # noqa: BLE001
            _fail(p, exc)
            b = None
        t = _now() - t
    out = original(self, batch, result, *args, **kwargs)
    if b is not None:
        t1 = _now()
        try:
            p.after_result(b, batch, result)
        except Exception as exc:  # noqa: BLE001
            _fail(p, exc)
        if b.cost_ns >= 0:
            p.cost.add_sched(b.cost_ns + t + _now() - t1)
    return out


def _timed(name: str, original, args, kwargs):
    """Time ``original`` as phase ``name`` of the current step (outermost occurrence wins)."""
    p = profiler()
    b = recording(p)
    if p is None or b is None or b.in_phase(name):
        return original(*args, **kwargs)
    return _around(p, b, PHASE, name, original, args, kwargs)


def draft(original, *args, **kwargs):
    return _timed(Phase.DRAFT.value, original, args, kwargs)


def draft_extend(original, *args, **kwargs):
    return _timed(Phase.DRAFT_EXTEND.value, original, args, kwargs)


def verify(original, *args, **kwargs):
    """The target's verify forward.  One made inside another phase belongs to that phase (UNO's
    draft is the target with a LoRA, through the same ``is_verify=True`` call).  Without speculative
    decoding the same seam is the target's one decode forward: phase ``decode``."""
    if not adapter.is_verify_call(args, kwargs):
        p = profiler()
        b = recording(p)
        if b is None or p.serving.spec or b.open or b.kind != KIND_DECODE:
            return original(*args, **kwargs)
        return _around(p, b, PHASE, _DECODE, original, args, kwargs)
    p = profiler()
    b = recording(p)
    if b is None or b.open:
        return original(*args, **kwargs)
    return _around(p, b, PHASE, _VERIFY, original, args, kwargs)


def _timed_decode(name: str, original, args, kwargs):
    """Like :func:`_timed`, for seams that the prefill path runs too: decode steps only."""
    p = profiler()
    b = recording(p)
    if p is None or b is None or b.kind != KIND_DECODE or b.in_phase(name):
        return original(*args, **kwargs)
    return _around(p, b, PHASE, name, original, args, kwargs)


def block_draft(original, *args, **kwargs):
    return _timed_decode(_DRAFT, original, args, kwargs)


def block_draft_extend(original, *args, **kwargs):
    return _timed_decode(Phase.DRAFT_EXTEND.value, original, args, kwargs)


def block_forward(original, self, *args, **kwargs):
    """ModelRunner.forward in a block drafter's decode step: count the forward passes that propose
    the block (the draft runner's, or any inside the draft phase), and time a draft-runner pass
    that no phase encloses (DFLASH calls it inline) as draft.  Otherwise a pass-through."""
    p = profiler()
    b = recording(p)
    if b is None or not b.block:
        return original(self, *args, **kwargs)
    draft_runner = adapter.is_draft_runner(self)
    if b.open:
        if b.in_phase(_DRAFT):
            b.denoise += 1
        return original(self, *args, **kwargs)
    if not draft_runner:
        return original(self, *args, **kwargs)
    b.denoise += 1
    return _around(p, b, PHASE, _DRAFT, original, (self,) + args, kwargs)


def _sub(name: str, original, args, kwargs):
    """Attention / MoE regions inside verify (or a plain decode step's ``decode``, where
    ``step.resolve`` files them as ``decode_attn`` / ``decode_moe``); the outermost region counts.

    While a timed graph copy is captured the region gets an external event pair instead (graph_clock).
    Runs for every attention and MoE block of every layer, so the handle is read inline."""
    s = SESSION
    if s is None or IS_COMPILING():
        return original(*args, **kwargs)
    p = s.profiler
    if p is None:
        return original(*args, **kwargs)
    g = p.graph
    if g is not None and g.capturing():
        return g.region(name, original, args, kwargs)
    b = recording(p)
    if (b is None or b.sub_depth or not (b.in_phase(_VERIFY) or b.in_phase(_DECODE))
            or (g is not None and g.foreign_capture())):
        return original(*args, **kwargs)
    return _around(p, b, SUB, name, original, args, kwargs)


def attn(original, *args, **kwargs):
    return _sub(Phase.VERIFY_ATTN.value, original, args, kwargs)


def moe(original, *args, **kwargs):
    return _sub(Phase.VERIFY_MOE.value, original, args, kwargs)


def control(original, self, recv_req, *args, **kwargs):
    """Answer our own control requests on SGLang's GetInternalStateReq channel; pass others on."""
    rid = adapter.control_rid(recv_req)
    s = SESSION
    if s is None or not is_control_rid(rid):
        return original(self, recv_req, *args, **kwargs)
    if s.profiler is not None:
        s.profiler.step_source = self
    return adapter.make_control_reply(s.handle_control(rid, self))


def request_end(original, self, abort_req, req, *args, **kwargs):
    """SGLang ended a request outside its steps (aborted while it waited, ``adapter_ends``): the
    history hears of it through the recorder, as of a step."""
    out = original(self, abort_req, req, *args, **kwargs)
    p = profiler()
    if p is not None and p.active and p.guard.ok("hooks"):
        try:
            p.recorder.submit(adapter.ended_request(req))
        except Exception as exc:  # noqa: BLE001
            p.guard.fail("hooks", exc)
    return out


# The step hooks (the CUDA-graph hooks are in ``graph_hooks``; ``session.HOOKS`` has both).
HOOKS = {
    "control": control,
    "run_batch": run_batch,
    "process_batch_result": process_batch_result,
    "verify": verify,
    "draft": draft,
    "draft_extend": draft_extend,
    "block_draft": block_draft,
    "block_draft_extend": block_draft_extend,
    "block_forward": block_forward,
    "attn": attn,
    "moe": moe,
    "request_end": request_end,
}
