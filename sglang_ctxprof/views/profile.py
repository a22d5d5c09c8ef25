"""The public profile: typed, frozen views built from a :class:`~sglang_ctxprof.aggregate.snapshot.Snapshot`.

:func:`build_profile` turns one snapshot (one rank, or ranks merged) into a :class:`Profile`:
one :class:`BucketView` per decode context bucket, one :class:`PrefillView` per prefill bucket,
one :class:`FitView` per phase ("ms per extra 1k tokens of context") and the run's
:class:`Totals`.  Every view keeps the exact integer counts (steps, request-steps, accepted,
committed and draft tokens, summed context) beside the means derived from them, so a renderer
never rebuilds a count from a rounded average.

``Profile.to_dict()`` is the documented ``/ctx_profile`` JSON (schema_version 1; the exact counts
are additive keys of each bucket) and ``Profile.from_dict()`` reads it back, also from a server
that predates the exact counts (they are then rebuilt from the means, to the nearest integer).
The renderers (``views/text``, ``views/prometheus``, the CLI's ``show``) take a ``Profile``.
Pure: imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional

from ..aggregate.snapshot import Snapshot
from ..model.buckets import Bucketing
from ..model.names import ABORT_QUEUED, ABORT_RETRACTED, LEAF_PHASES, REPORTED_PHASES, SCHEMA_VERSION, Phase
from ..model.roofline import bucket_roofline
from ..model.names import FIT_ROBUST_METHOD
from ..model.stats import DurationStats, FitMemo, theil_sen
from ..aggregate import acceptance as acc
from ..aggregate.outliers import robust as robust_bucket
from .bucket_views import BucketView, PhaseView, PrefillView, _div

__all__ = ["BucketView", "FitView", "PhaseView", "PrefillView", "Profile", "Totals", "build_profile", "summarize"]


@dataclass(frozen=True, slots=True)
class FitView:
    ms_per_1k_ctx: float
    intercept_ms: float
    r2: float
    n: int
    # The outlier-robust fit (method, ms_per_1k_ctx, intercept_ms, r2, n) on a bounded sample of the
    # points; the diagnosis uses it.  The fields above are ordinary least squares over every step.
    robust: Optional[Mapping[str, Any]] = None

    def best(self) -> tuple[float, float, float, int, str]:
        """(slope, intercept, r2, n, method): the robust fit when there is one, else least squares."""
        if self.robust:
            r = self.robust
            return (float(r["ms_per_1k_ctx"]), float(r["intercept_ms"]), float(r["r2"]), int(r["n"]),
                    str(r["method"]))
        return self.ms_per_1k_ctx, self.intercept_ms, self.r2, self.n, "least-squares"

    def to_dict(self) -> dict[str, Any]:
        out = {"ms_per_1k_ctx": self.ms_per_1k_ctx, "intercept_ms": self.intercept_ms, "r2": self.r2,
               "n": self.n, "method": "least-squares"}
        if self.robust:
            out["robust"] = dict(self.robust)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FitView":
        return cls(float(d["ms_per_1k_ctx"]), float(d["intercept_ms"]), float(d["r2"]), int(d["n"]),
                   d.get("robust"))


@dataclass(frozen=True, slots=True)
class Totals:
    records: int = 0
    decode_steps: int = 0
    prefill_batches: int = 0
    accepted: int = 0
    # decode steps', re-prefills' and mixed batches' decode rows' (1 + committed == completion_tokens)
    committed: int = 0
    retractions: int = 0
    requests_tracked: int = 0
    requests_evicted: int = 0
    requests_aborted: int = 0  # aborted while waiting in SGLang's queue
    requests_aborted_retracted: int = 0  # of those, retracted (the others: names.ABORT_QUEUED)

    def aborted_by_kind(self) -> dict[str, int]:
        """``requests_aborted`` by ``names.ABORT_KINDS``, as the live counter labels it."""
        r = self.requests_aborted_retracted
        return {ABORT_QUEUED: self.requests_aborted - r, ABORT_RETRACTED: r}

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Totals":
        return cls(**{f.name: int(d.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class Profile:
    """The ``/ctx_profile`` body.  The serving envelope (``enabled`` … ``ranks``) is filled by the
    HTTP view; a profile built from a saved or local snapshot leaves it at its defaults."""

    timing: Optional[str] = None
    hw: Optional[Mapping[str, Any]] = None
    algorithms: tuple[str, ...] = ()
    bucketing: Mapping[str, Any] = field(default_factory=dict)
    buckets: tuple[BucketView, ...] = ()
    prefill: tuple[PrefillView, ...] = ()
    fits: Mapping[str, FitView] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    enabled: Optional[bool] = None
    degraded: Optional[list] = None
    dropped: int = 0
    spans_dropped: int = 0
    ranks: tuple[Mapping[str, Any], ...] = ()
    schema_version: int = SCHEMA_VERSION
    # Host time between steps and inside steps outside the model call (count, mean, p99, total ms).
    host: Mapping[str, Any] = field(default_factory=dict)
    # Acceptance by position for every bucket of requests' own context, also those where no step's
    # batch-mean context fell (label, lo, hi, acceptance_by_position).
    acceptance_by_ctx: tuple[Mapping[str, Any], ...] = ()

    def served(self, **envelope: Any) -> "Profile":
        return replace(self, **envelope)

    def to_dict(self, envelope: bool = True) -> dict[str, Any]:
        """The JSON body; ``envelope=False`` leaves out the serving fields (a per-rank profile)."""
        out: dict[str, Any] = {"schema_version": self.schema_version}
        if envelope:
            out.update(enabled=self.enabled, degraded=self.degraded, dropped=self.dropped,
                       spans_dropped=self.spans_dropped, ranks=[dict(r) for r in self.ranks])
        return out | {
            "timing": self.timing, "hw": self.hw,
            "algorithms": list(self.algorithms),
            "phases": list(REPORTED_PHASES), "leaf_phases": list(LEAF_PHASES),
            "bucketing": dict(self.bucketing),
            "buckets": [b.to_dict() for b in self.buckets],
            "prefill": [p.to_dict() for p in self.prefill],
            "fits": {p: f.to_dict() for p, f in self.fits.items()},
            "totals": self.totals.to_dict(),
            "host": dict(self.host),
            "acceptance_by_ctx": [dict(a) for a in self.acceptance_by_ctx],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Profile":
        """Read a ``/ctx_profile`` body; raises ValueError naming what is wrong with it."""
        try:
            return cls(
                timing=d.get("timing"), hw=d.get("hw"), algorithms=tuple(d.get("algorithms") or ()),
                bucketing=dict(d.get("bucketing") or {}),
                buckets=tuple(BucketView.from_dict(b) for b in d.get("buckets") or ()),
                prefill=tuple(PrefillView.from_dict(p) for p in d.get("prefill") or ()),
                fits={str(p): FitView.from_dict(f) for p, f in (d.get("fits") or {}).items()},
                totals=Totals.from_dict(d.get("totals") or {}),
                enabled=d.get("enabled"), degraded=d.get("degraded"), dropped=int(d.get("dropped", 0)),
                spans_dropped=int(d.get("spans_dropped", 0)), ranks=tuple(d.get("ranks") or ()),
                schema_version=int(d.get("schema_version", SCHEMA_VERSION)),
                host=dict(d.get("host") or {}),
                acceptance_by_ctx=tuple(d.get("acceptance_by_ctx") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a ctx profile body: {type(exc).__name__}: {exc}") from exc


def _phase_view(st: DurationStats) -> PhaseView:
    s = st.summary()
    return PhaseView(int(s["count"]), s["mean_ms"], s["p50_ms"], s["p90_ms"], s["p99_ms"], s["total_ms"])


def build_profile(snap: Snapshot, fits: Optional[FitMemo] = None) -> Profile:
    """The public profile of a snapshot, with verify attention's % of the HBM roofline per bucket
    when the snapshot's device facts allow (``model/roofline``).  ``fits``: the caller's memo of
    recent Theil-Sen fits (a caller that rebuilds every few steps); without one every fit is computed."""
    bk = Bucketing.from_dict(snap.bucketing)
    buckets = []
    for i in sorted(snap.decode):
        b = snap.decode[i]
        lo, hi = bk.bounds(i)
        phases = {p: _phase_view(b.phases[p]) for p in REPORTED_PHASES if p in b.phases}
        attn = phases.get(Phase.VERIFY_ATTN.value)
        buckets.append(BucketView(
            bk.label(i), lo, hi, b, phases, bucket_roofline(snap.hw, _div(b.attn_ctx_sum, attn.count) if attn else 0.0,
                                    attn.mean_ms if attn else None),
            acc.view(snap.acceptance.get(i, {})), acc.exec_view(b.exec) if b.exec else None,
            b.step_bs1.mean if b.step_bs1 is not None and b.step_bs1.count else None,
            robust_bucket(b.phases.get(Phase.STEP.value), b.phases, b.slow)))
    prefill = []
    for i in sorted(snap.prefill):
        b = snap.prefill[i]
        lo, hi = bk.bounds(i)
        st = b.phases.get(Phase.PREFILL.value)
        prefill.append(PrefillView(bk.label(i), lo, hi, b,
                                   _phase_view(st) if st is not None else PhaseView(0, 0, 0, 0, 0, 0)))
    fit_views = {}
    for p in REPORTED_PHASES:
        f = snap.fits.get(p)
        sol = f.solve() if f is not None else None
        if sol is not None:
            pts = snap.fit_points.get(p)
            rob = theil_sen(pts.points, memo=fits) if pts is not None and len(pts.points) >= 2 else None
            robust = None if rob is None or pts is None else {
                "method": FIT_ROBUST_METHOD, "ms_per_1k_ctx": rob["slope"], "intercept_ms": rob["intercept"],
                "r2": rob["r2"], "n": int(rob["n"]), "sampled_of": pts.seen}
            fit_views[p] = FitView(sol["slope"], sol["intercept"], sol["r2"], int(sol["n"]), robust)
    totals = Totals(
        records=snap.records,
        decode_steps=sum(b.steps for b in snap.decode.values()),
        prefill_batches=sum(b.steps for b in snap.prefill.values()),
        accepted=sum(b.accepted for b in snap.decode.values()),
        committed=sum(b.committed for b in snap.decode.values())
        + sum(b.committed + b.decoded for b in snap.prefill.values()),
        retractions=sum(b.retractions for b in snap.prefill.values()) + snap.retractions_unseen,
        requests_tracked=snap.requests_tracked,
        requests_evicted=snap.requests_evicted,
        requests_aborted=snap.requests_aborted,
        requests_aborted_retracted=snap.requests_aborted_retracted,
    )
    accept = []
    for i in sorted(snap.acceptance):
        v = acc.view(snap.acceptance[i])
        if v is not None:
            lo, hi = bk.bounds(i)
            accept.append({"label": bk.label(i), "lo": lo, "hi": hi, "acceptance_by_position": v})
    host = {"between_steps": snap.host_gaps.summary(), "in_step": snap.host_in_step.summary()}
    return Profile(timing=snap.timing, hw=snap.hw, algorithms=tuple(sorted(snap.algorithms)),
                   bucketing=bk.to_dict(), buckets=tuple(buckets), prefill=tuple(prefill), fits=fit_views,
                   totals=totals, schema_version=snap.schema_version, host=host,
                   acceptance_by_ctx=tuple(accept))


def summarize(state: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body, without serving fields, of one state dict as it crosses the control channel
    (one rank's answer, a merge, or a saved state)."""
    return build_profile(Snapshot.from_dict(state)).to_dict(envelope=False)
