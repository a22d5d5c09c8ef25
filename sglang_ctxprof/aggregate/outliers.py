"""Slow steps set apart: the robust per-bucket statistics the verdict rests on.

A few steps can be tens of times slower than the rest of their bucket: on a GPU the first steps at a
new shape compile and autotune kernels; on the CPU the first steps of a server warm caches and
allocators (a real SGLang 0.5.16 server showed a mean draft of 137 ms and 302 ms in its first two
buckets against 6-7 ms later).  A mean over a bucket with three such steps describes them, not the
bucket.  So each decode bucket keeps, besides its histograms, its :data:`KEEP` slowest steps with
their phases and when they ran (:class:`SlowSteps`, bounded, merged across ranks), and
:func:`robust` reads them against the bucket's median step:

* a step slower than :data:`OUTLIER_FACTOR` x the bucket's median step is an **outlier**;
* the bucket's **robust** step and phase means are the means of the other steps, exact: the totals
  less the outliers' own values (so leaf phases still add up to the step);
* each outlier is reported apart: when it ran (the server's decode step number and the bucket's),
  how much slower it was, which phase took the excess, and ``warmup`` when it was among the first
  :data:`WARMUP_STEPS` decode steps of the server or of its bucket (a new shape).

When all :data:`KEEP` slowest steps kept for a bucket pass the fence (more may have), ``truncated``
says so, and the robust means still include the rest.  Pure: imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

import heapq
from typing import Any, Mapping, Optional

from ..model.names import Phase
from ..model.records import leaf_phases
from ..model.stats import DurationStats

KEEP = 16  # slowest steps kept per bucket
OUTLIER_FACTOR = 3.0  # a step above this many times its bucket's median step is set apart
WARMUP_STEPS = 8  # the first steps of the server, or of a bucket, whose slowness reads "warm-up?"

# (step_ms, server decode-step ordinal, bucket ordinal, phases_ms)
Entry = tuple[float, int, int, Mapping[str, float]]


class _Phases(dict):
    """A step's phases inside a heap entry: never decides the order (ties on time and ordinals
    happen when ranks merge)."""

    def __lt__(self, other: object) -> bool:
        return False


class SlowSteps:
    """The :data:`KEEP` slowest steps of a bucket (a min-heap on step time)."""

    __slots__ = ("heap",)

    def __init__(self, entries: Optional[list[Entry]] = None) -> None:
        self.heap: list[Entry] = []
        for e in entries or ():
            self.add(*e)

    def add(self, step_ms: float, ordinal: int, bucket_ordinal: int, phases: Mapping[str, float]) -> None:
        h = self.heap
        if len(h) < KEEP:
            heapq.heappush(h, (step_ms, ordinal, bucket_ordinal, _Phases(phases)))
        elif step_ms > h[0][0]:
            heapq.heapreplace(h, (step_ms, ordinal, bucket_ordinal, _Phases(phases)))

    def merge(self, other: "SlowSteps") -> None:
        for e in other.heap:
            self.add(*e)

    def copy(self) -> "SlowSteps":
        return SlowSteps(list(self.heap))

    def to_state(self) -> list[list[Any]]:
        return [[s, o, b, dict(p)] for s, o, b, p in sorted(self.heap, key=lambda e: -e[0])]

    @classmethod
    def from_state(cls, s: Any) -> "SlowSteps":
        return cls([(float(x[0]), int(x[1]), int(x[2]), {str(k): float(v) for k, v in (x[3] or {}).items()})
                    for x in s or ()])


def robust(step: Optional[DurationStats], phases: Mapping[str, DurationStats],
           slow: Optional[SlowSteps]) -> Optional[dict[str, Any]]:
    """The bucket's robust step and phase means and its outliers, or None without steps."""
    if step is None or not step.count:
        return None
    median = step.quantile(0.5)
    fence = OUTLIER_FACTOR * median
    outs = sorted((e for e in (slow.heap if slow is not None else ()) if e[0] > fence), key=lambda e: -e[0])
    n = step.count - len(outs)
    if n <= 0:  # more than half the steps are "slow": then they are the bucket
        outs, n = [], step.count
    step_ms = (step.total - sum(e[0] for e in outs)) / n
    clean: dict[str, float] = {}
    for p, st in phases.items():
        if p == Phase.STEP.value or not st.count:
            continue
        mine = [e[3][p] for e in outs if p in e[3]]
        rest = st.count - len(mine)
        clean[p] = (st.total - sum(mine)) / rest if rest > 0 else st.mean
    rows = []
    for s, o, bo, ph in outs:
        excess = {p: ph[p] - clean.get(p, 0.0) for p in leaf_phases(ph)}  # an unsplit forward counts whole
        top = max(excess, key=lambda p: excess[p]) if excess else ""
        rows.append({"step_ms": s, "excess_ms": s - step_ms, "ordinal": o, "bucket_ordinal": bo, "phase": top,
                     "phase_excess_ms": excess.get(top, 0.0),
                     "warmup": o < WARMUP_STEPS or bo < WARMUP_STEPS})
    return {"step_ms": step_ms, "phases": clean, "median_step_ms": median, "fence_ms": fence,
            "factor": OUTLIER_FACTOR, "steps": n, "outliers": rows,
            "truncated": bool(slow is not None and len(slow.heap) >= KEEP and len(outs) >= KEEP)}


def describe(label: str, r: Mapping[str, Any]) -> str:
    """One phrase about a bucket's outliers: how many, where, how much, which phase, warm-up?"""
    outs = r["outliers"]
    n = len(outs)
    ms = ", ".join(f"{o['step_ms']:.0f}" for o in outs[:4]) + (", ..." if n > 4 else "")
    phases = sorted({o["phase"] for o in outs if o["phase"]})
    line = (f"bucket {label}: {n}{'+' if r.get('truncated') else ''} step{'s' if n != 1 else ''} set apart "
            f"({ms} ms against a typical {r['step_ms']:.2f} ms; "
            f"{sum(o['excess_ms'] for o in outs):.0f} ms of excess"
            f"{', in ' + '/'.join(phases) if phases else ''})")
    warm = [o for o in outs if o["warmup"]]
    if warm and len(warm) == n:
        first_server = all(o["ordinal"] < WARMUP_STEPS for o in outs)
        line += (f": the first steps of the {'server' if first_server else 'bucket (a new shape)'}: warm-up?")
    elif warm:
        line += f": {len(warm)} of them among the first steps (warm-up?)"
    return line
