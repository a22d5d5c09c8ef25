"""Per-step accumulation of timing marks, and their resolution into phase durations.

A :class:`StepBuilder` lives from ``run_batch`` until ``process_batch_result`` of the same batch
(keyed by ``batch.forward_iter``).  Hooks append ``(phase, start, end)`` marks from whatever clock is
in use; :func:`resolve` turns them into milliseconds once the device has finished the step.

Phase arithmetic (all in ms):

* ``draft``, ``verify``, ``draft_extend``: sums of their intervals;
* ``verify_attn`` / ``verify_moe``: attention / MoE intervals recorded while inside ``verify``;
* ``verify_rest = verify - verify_attn - verify_moe``;
* plain (non-speculative) decode: the target's forward is ``decode``, and the attention / MoE marks
  inside it become ``decode_attn`` / ``decode_moe`` (``decode_rest`` the remainder).  Under a CUDA
  graph (``graph_ran``) those blocks run inside the replay and leave no marks: the split is then left
  out, never reported as zero;
* under CUDA graphs the split comes from :mod:`graph_clock` on sampled steps and is left out (not
  zero) on the others: ``b.split`` (a :class:`SplitState`) says which, written only through the
  builder's ``split_*`` methods;
* the remainder ``step - (draft + verify + draft_extend)`` is ``overhead`` for algorithms whose
  seams we know, else ``unattributed``.  So the leaf phases add up to the step span exactly.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Optional

from ..model.names import FORWARD_SPLIT, TIMING_CPU_MODES, TIMING_CUDA_GRAPH, TIMING_CUDA_GRAPH_EVENTS, Phase

_D, _V, _DE = Phase.DRAFT.value, Phase.VERIFY.value, Phase.DRAFT_EXTEND.value
_VA, _VM, _VR = Phase.VERIFY_ATTN.value, Phase.VERIFY_MOE.value, Phase.VERIFY_REST.value
_DEC = Phase.DECODE.value
_TOP = frozenset((_D, _V, _DE, _DEC))  # the phases that tile a step (the blocks nest inside them)

if TYPE_CHECKING:
    from .clocks import Clock, Token
    from .graph_clock import GraphRead


class SplitState(Enum):
    """Where a step's verify attention/MoE split comes from."""

    BLOCKS = "blocks"  # the block marks (eager verify): no graph read involved
    PENDING = "pending"  # a timed graph copy ran: its events wait to be read (``split_reads``)
    READ = "read"  # read from the timed copy's events (``split_ms``)
    UNAVAILABLE = "unavailable"  # verify ran in a graph we do not read: left out, never guessed


class StepBuilder:
    __slots__ = ("kind", "t_start_ns", "span", "marks", "open", "pre", "sub_depth", "split", "split_reads",
                 "split_ms", "eager", "graph_ran", "cost_ns", "step_id", "block", "denoise", "t_end_ns")

    def __init__(self, kind: str, t_start_ns: int) -> None:
        self.kind = kind
        self.t_start_ns = t_start_ns
        self.span: Optional[tuple[Token, Token]] = None
        self.marks: list[tuple[str, Token, Token]] = []
        self.open: list[str] = []  # stack of named phases currently open
        self.pre: Optional[tuple] = None  # adapter.reqs_before(...) of the batch
        self.sub_depth = 0  # >0 while inside an attention/MoE region (outermost wins)
        self.split = SplitState.BLOCKS  # see SplitState; written by the split_* methods only
        self.split_reads: list[GraphRead] = []
        self.split_ms: dict[str, float] = {}
        self.eager: Optional[bool] = None  # eager fallback decided for this step (graph_clock.force_eager)
        self.graph_ran: Optional[bool] = None  # SGLang's can_run_cuda_graph of the step (None: unknown)
        self.cost_ns = -1  # our own scheduler-thread ns on a timed step (cost.py); -1: not timed
        self.step_id = 0  # the batch's forward_iter, set when run_batch returns
        self.block = False  # a block drafter's decode step (names.BLOCK_ALGORITHMS)
        self.denoise = 0  # draft model forward passes that proposed the block
        self.t_end_ns = 0  # host clock when run_batch returned (gaps between steps)

    def in_phase(self, name: str) -> bool:
        return name in self.open

    # ---- the verify split (graph_clock is the one caller) ----------------------------------------
    def split_unavailable(self) -> None:
        """Verify ran (also) in a graph whose events are not read: the split is left out."""
        self.split = SplitState.UNAVAILABLE
        self.split_reads = []

    def split_pending(self, read: GraphRead) -> None:
        """A timed graph copy ran for this step: read its events after the step (unless already
        unavailable: one unread graph spoils the step's split)."""
        if self.split is not SplitState.UNAVAILABLE:
            self.split = SplitState.PENDING
            self.split_reads.append(read)

    def split_read(self, ms: dict[str, float]) -> None:
        self.split = SplitState.READ
        self.split_ms = ms
        self.split_reads = []


def resolve(b: StepBuilder, clock: Clock, full_phases: bool) -> Optional[tuple[float, dict[str, float]]]:
    """Return ``(step_ms, phases_ms)`` or None if the device has not finished yet."""
    if b.span is None:
        return None
    step_ms = clock.elapsed_ms(*b.span)
    if step_ms is None:
        return None
    sums: dict[str, float] = {}
    for phase, x, y in b.marks:
        ms = clock.elapsed_ms(x, y)
        if ms is None:
            return None
        sums[phase] = sums.get(phase, 0.0) + ms
    phases: dict[str, float] = {}
    named = 0.0
    for p in (_D, _V, _DE, _DEC):
        if p in sums:
            phases[p] = sums[p]
            named += sums[p]
    if _DEC in phases and not b.graph_ran:  # plain decode: its blocks are marked as attn/MoE regions
        da, dm, dr = FORWARD_SPLIT[_DEC]
        phases[da] = sums.get(_VA, 0.0)
        phases[dm] = sums.get(_VM, 0.0)
        phases[dr] = max(0.0, phases[_DEC] - phases[da] - phases[dm])
    if _V in phases and b.split in (SplitState.PENDING, SplitState.UNAVAILABLE):
        pass  # split unavailable (verify ran in a CUDA graph on an unsampled step): never guess
    elif _V in phases:
        pre = b.split_ms
        attn = sums.get(_VA, 0.0) + pre.get(_VA, 0.0)
        moe = sums.get(_VM, 0.0) + pre.get(_VM, 0.0)
        phases[_VA] = attn
        phases[_VM] = moe
        phases[_VR] = max(0.0, phases[_V] - attn - moe)
    rest = max(0.0, step_ms - named)
    if full_phases:
        phases[Phase.OVERHEAD.value] = rest
    else:
        phases[Phase.UNATTRIBUTED.value] = rest
    if named > step_ms and not _timed_twice(b, clock):
        step_ms = named  # marks not nested in the span, or phases overlapping on two streams: the leaves
    # still tile the step; a phase timed twice (a hook firing inside itself) keeps the span, for leaf_sum
    return step_ms, phases


def _timed_twice(b: StepBuilder, clock: Clock) -> bool:
    """Whether two marks of one top-level phase overlap, each starting over 1 us before the other ends
    (the rare path: the named phases overran the span; a phase's own calls run one after another)."""
    top = [(p, x, y) for p, x, y in b.marks if p in _TOP]
    for i, (p, x, y) in enumerate(top):
        for q, u, v in top[i + 1:]:
            if q == p and min(clock.elapsed_ms(u, y) or 0.0, clock.elapsed_ms(x, v) or 0.0) > 1e-3:
                return True
    return False


def timing_label(b: StepBuilder, clock_mode: str) -> str:
    """How this step's numbers were obtained, from what ran: ``cpu`` / ``cpu_thread`` (CPU clock);
    ``cuda_graph_events`` (verify replayed a timed graph copy and its split was read);
    ``cuda_graph`` (verify ran in a CUDA graph, full or piecewise, whose split was not read: the
    phases come from CUDA events around it, the split is left out); else ``cuda_events``
    (eager: every phase and block from plain CUDA events)."""
    if clock_mode in TIMING_CPU_MODES:
        return clock_mode
    if b.split is SplitState.READ:
        return TIMING_CUDA_GRAPH_EVENTS
    if b.graph_ran or b.split is SplitState.UNAVAILABLE:
        return TIMING_CUDA_GRAPH
    return clock_mode


def release(b: StepBuilder, clock: Clock) -> None:
    if b.span is not None:
        clock.release(b.span[0])
        clock.release(b.span[1])
    for _, x, y in b.marks:
        clock.release(x)
        clock.release(y)
