"""The evidence a diagnosis rests on, in one typed shape whatever its source.

:func:`evidence_from_profile` (a ``/ctx_profile`` :class:`~.profile.Profile`) or
:func:`evidence_from_sweep` (a saved sweep's per-context rows) gives an :class:`Evidence`: one
:class:`Point` per context (acceptance length, step time, leaf phases), the per-phase context fits
(ms per 1k tokens of context; the robust Theil-Sen fit where the profile has one), execution modes,
acceptance by position, host time, the loss counters and the buckets with outlier steps.

Every per-bucket number of a profile is its **robust** mean: the mean over the bucket's steps
without those slower than ``OUTLIER_FACTOR`` x its median step, which are reported apart.  A bucket
of fewer than :data:`MIN_POINT_STEPS` steps has no median to hold a slow step against, so its point
is ``thin``: the verdict compares the others (:func:`solid`: the decomposition, the baseline, the
ledger and the what-if alike).  A few warm-up steps therefore cannot flip the verdict.
:func:`ledger_points` hands the points to ``aggregate.ledger``.  Pure: imports nothing of SGLang,
torch or OTel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from ..model.guard import RECORDING
from ..model.names import LEAF_PHASES, SPEC_PHASES, Phase
from ..model.records import leaf_ms
from ..model.stats import theil_sen
from . import capture_refs
from .audit_view import audit_counts
from .profile import Profile

_STEP, _V = Phase.STEP.value, Phase.VERIFY.value
_DEC = Phase.DECODE.value
HOST_GAP = "host_gap"  # a point's typical host time between steps (ms), beside its phases
MIN_POINT_STEPS = 5  # a profile bucket with fewer decode steps is thin: no end of the comparison


@dataclass(frozen=True)
class Point:
    label: str
    ctx: float  # mean context per request
    ctx_sum: float  # mean summed context per step (the fits' x, in tokens)
    steps: int
    al: float  # accepted tokens per request-step (bonus included)
    step_ms: float
    phases: Mapping[str, float]
    noise: Mapping[str, float] = field(default_factory=dict)
    batch: float = 1.0
    thin: bool = False  # a profile bucket of fewer than MIN_POINT_STEPS steps (a sweep's point never is)

    @property
    def tok_s(self) -> float:
        return 1e3 * self.al / self.step_ms if self.step_ms > 0 else 0.0


@dataclass(frozen=True)
class Evidence:
    source: str
    points: tuple[Point, ...]
    fits: Mapping[str, tuple[float, float, float, int, str]]  # slope, intercept, r2, n, method
    timing: Optional[str] = None
    hw: Optional[Mapping[str, Any]] = None
    exec_modes: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    acceptance: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    host: Mapping[str, Any] = field(default_factory=dict)
    dropped: int = 0
    evicted: int = 0
    draft_budget: Optional[int] = None
    # Buckets with steps set apart as outliers: (label, ``aggregate.outliers.robust`` dict).
    outliers: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    captures: tuple[Mapping[str, Any], ...] = ()  # recent deep captures (views.capture_refs)
    audit: Mapping[str, int] = field(default_factory=dict)  # the ranks' self-audit: invariant -> violations
    partial: tuple[str, ...] = ()  # a served profile's ranks that gave nothing, or not all (why, one each)


def speculative_phases(ev: Evidence) -> list[str]:
    """The draft and verify phases ``ev``'s points hold: what a plain arm (the ledger's measured
    plain decode) must hold none of."""
    return sorted({p for pt in ev.points for p in SPEC_PHASES if p in pt.phases})


def leaves(phases: Mapping[str, float]) -> dict[str, float]:
    """A point's leaf phases and their times (``records.leaf_ms``: a forward without its attention/MoE
    split counts whole); the step, the host gap and any other key are left out."""
    return leaf_ms(phases)


def evidence_from_profile(profile: Profile, source: str = "profile") -> Evidence:
    pts = []
    for b in profile.buckets:
        step = b.robust_ms(_STEP)
        if not b.steps or not step or not b.accepted_per_step:  # no acceptance counted: no point (as a sweep's)
            continue
        ph = {p: b.robust_ms(p) or 0.0 for p in b.phases}
        noise = {p: 2 * max(0.0, v.p90_ms - v.p50_ms) / math.sqrt(max(1, v.count)) for p, v in b.phases.items()}
        pts.append(Point(b.label, b.mean_ctx, b.ctx_sum / b.steps, b.steps, b.accepted_per_step, step, ph,
                         noise, b.mean_batch_size, b.steps < MIN_POINT_STEPS))
    gap = ((profile.host or {}).get("between_steps") or {})
    if gap.get("count"):  # the typical host time between steps (median: idle gaps between requests)
        pts = [replace(p, phases={**p.phases, HOST_GAP: gap["p50_ms"]}) for p in pts]
    fits = {p: f.best() for p, f in profile.fits.items()}
    budgets = [b.draft_tokens_per_step for b in profile.buckets if b.draft_tokens]
    return Evidence(source, tuple(pts), fits, profile.timing, profile.hw,
                    tuple((b.label, b.exec_mode) for b in profile.buckets if b.exec_mode),
                    tuple((a["label"], a["acceptance_by_position"]) for a in profile.acceptance_by_ctx),
                    dict(profile.host), int(profile.dropped or 0), int(profile.totals.requests_evicted),
                    round(max(budgets)) - 1 if budgets else None,
                    tuple((b.label, b.robust) for b in profile.buckets if b.robust and b.robust.get("outliers")),
                    capture_refs.recent(profile), audit_counts(profile.ranks), partial_ranks(profile))


def partial_ranks(profile: Profile) -> tuple[str, ...]:
    """Why the served profile is not every rank's whole record: a rank that did not answer (its
    error), and the recording components (``guard.RECORDING``) that failed on the ranks that did
    (``degraded``): such a rank records no more steps.  An output's failure (logs, metrics, an
    exporter) leaves the record whole."""
    out = [f"rank {i} did not answer: {r['error']}" for i, r in enumerate(profile.ranks)
           if isinstance(r, Mapping) and "error" in r]
    for d in profile.degraded or ():
        comps = d.get("components") if isinstance(d, Mapping) else None
        stopped = sorted(c for c in comps if c in RECORDING) if isinstance(comps, Mapping) else ()
        if stopped:
            out.append(f"stopped recording on a rank: {', '.join(stopped)} failed")
    return tuple(out)


def evidence_from_sweep(rows: list[Mapping[str, Any]], meta: Mapping[str, Any], source: str = "sweep") -> Evidence:
    """A saved sweep: one point per context (medians over repeats; noise = half the range), placed at
    the mean context its measured steps ran at (the prompt plus what was decoded so far, as the live
    profile's buckets place theirs), or at the prompt length for a point saved without it."""
    pts = []
    for r in rows:
        ph = {p: st["median"] for p, st in (r.get("phases_ms") or {}).items()}
        al = (r.get("server_accept_per_step") or r.get("accept_per_step") or {}).get("median")
        if ph.get(_STEP) and not al and _DEC in ph:
            al = 1.0  # a plain-decode arm: one token per step
        if not ph.get(_STEP) or not al:
            continue
        noise = {p: st.get("spread", 0.0) for p, st in r["phases_ms"].items()}
        x = float((r.get("mean_ctx") or {}).get("median") or r["ctx"])
        pts.append(Point(str(r["ctx"]), x, x, int(r.get("repeats", 1)), float(al), float(ph[_STEP]), ph, noise))
    fits = {}
    for p in LEAF_PHASES + (_STEP, _V, _DEC):  # a whole forward too: it is a leaf where its split is missing
        xy = [(pt.ctx_sum / 1e3, pt.phases[p]) for pt in pts if p in pt.phases]
        ts = theil_sen(xy) if len(xy) >= 2 else None
        if ts is not None:
            fits[p] = (ts["slope"], ts["intercept"], ts["r2"], int(ts["n"]), "theil-sen over contexts")
    return Evidence(source, tuple(pts), fits, meta.get("timing"), meta.get("hw"))



def solid(points: Sequence[Point]) -> tuple[Point, ...]:
    """The points that are not thin, or every point when all of them are (better than nothing)."""
    kept = tuple(p for p in points if not p.thin)
    return kept or tuple(points)


def left_out(points: Sequence[Point]) -> tuple[Point, ...]:
    """The thin points :func:`solid` leaves out (none when every point is thin)."""
    return tuple(p for p in points if p.thin) if any(not p.thin for p in points) else ()


def solid_acceptance(ev: Evidence) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """Acceptance by position of the own-context buckets with at least ``MIN_POINT_STEPS`` steps, or
    all of them when none has."""
    kept = tuple((lbl, v) for lbl, v in ev.acceptance if v and v.get("n_steps", 0) >= MIN_POINT_STEPS)
    return kept or ev.acceptance


def ledger_points(ev: Evidence) -> list[dict[str, Any]]:
    """The evidence's points (:func:`solid`) in the shape of ``aggregate.ledger``."""
    return [{"ctx": p.ctx, "label": p.label, "al": p.al, "phases": {**p.phases, _STEP: p.step_ms}}
            for p in solid(ev.points)]

