"""The one layout of a step's phases on a time line, shared by the trace export and OTel spans.

Phases are measured durations, not timestamps.  They are laid back to back from the step's start in
execution order (``TOP_PHASES``), and a target forward's split (``FORWARD_SPLIT``: verify's or plain
decode's attention, MoE and rest) back to back inside it, although attention and MoE really
interleave layer by layer.  Every boundary is a whole nanosecond taken from the running sum of the
durations (``records.ms_to_ns``), so rounding never accumulates; the last top phase ends where the
step ends when the sum is within a microsecond of it, and the last child where its parent ends:
when the leaf phases add up to the step (the profiler's rule) the slices tile it exactly.

A phase shorter than a nanosecond is left out, except a forward that holds a split.  Pure.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from .names import FORWARD_SPLIT, Phase
from .records import ms_to_ns

TOP_PHASES: tuple[str, ...] = (Phase.DRAFT.value, Phase.VERIFY.value, Phase.DECODE.value,
                               Phase.DRAFT_EXTEND.value, Phase.OVERHEAD.value, Phase.UNATTRIBUTED.value)
NOTE = ("phases laid back to back from the step start in execution order (attention and MoE "
        "interleave layer by layer in reality); they tile the step exactly")
_SNAP_NS = 1000  # a last top phase this close to the step's end ends there (float rounding of the sum)


class PhaseSlice(NamedTuple):
    name: str
    parent: str  # "" for a top phase; else the forward phase it splits
    start_ns: int
    end_ns: int


def lay_phases(phases: Mapping[str, float], start_ns: int, end_ns: int) -> list[PhaseSlice]:
    """The slices of one step's ``phases`` (ms) inside ``[start_ns, end_ns)``, each top phase
    followed by its children."""
    present = [p for p in TOP_PHASES if p in phases and (ms_to_ns(phases[p]) > 0 or p in FORWARD_SPLIT)]
    out: list[PhaseSlice] = []
    cum = 0.0
    cur = start_ns
    for k, p in enumerate(present):
        cum += float(phases[p])
        end = start_ns + ms_to_ns(cum)
        if k == len(present) - 1 and abs(end - end_ns) <= _SNAP_NS:
            end = end_ns
        end = min(end, end_ns)
        out.append(PhaseSlice(p, "", cur, end))
        kids = [c for c in FORWARD_SPLIT.get(p, ()) if c in phases and ms_to_ns(phases[c]) > 0]
        kcum, kcur = 0.0, cur
        for j, c in enumerate(kids):
            kcum += float(phases[c])
            kend = end if j == len(kids) - 1 else min(end, cur + ms_to_ns(kcum))
            out.append(PhaseSlice(c, p, kcur, kend))
            kcur = kend
        cur = end
    return out
