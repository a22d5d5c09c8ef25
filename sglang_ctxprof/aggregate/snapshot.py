"""The aggregator's state as typed, frozen data: what one rank answers and what ranks merge into.

A :class:`Snapshot` holds, per context bucket, a :class:`BucketState` with the exact integer counts
(steps, request-steps, accepted, committed and draft tokens, summed context) and one
:class:`~sglang_ctxprof.model.stats.DurationStats` per phase; per phase a
:class:`~sglang_ctxprof.model.stats.LinearFit`; the request summaries; and the run's meta (timing
mode, algorithms seen, device facts).  Nothing in it is rounded: the public profile
(``views/profile``) derives its means from these counts.

``to_dict()`` gives builtins with string keys (msgpack-safe: this is what crosses SGLang's control
channel) and ``from_dict()`` reads them back; ``merge`` adds ranks exactly (counts, histogram bins
and fit sums add).  Pure: imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Optional

from ..model.buckets import Bucketing
from ..model.names import SCHEMA_VERSION, TIMING_RANK
from ..model.stats import DurationStats, LinearFit, PointSample
from . import acceptance as acc
from .outliers import SlowSteps

@dataclass(frozen=True, slots=True)
class BucketState:
    """Exact counts of one bucket.  For prefill buckets ``steps`` counts batches, ``req_steps``
    requests, ``ctx_sum`` prompt tokens and ``cached_sum`` the part of them found in the prefix cache,
    ``committed`` the tokens re-prefills appended, ``retractions`` SGLang's retractions of the
    requests it prefilled again (one that hit a prefill in flight appended no token) and ``decoded``
    the tokens running requests decoded inside its batches (mixed chunked prefill); the acceptance
    counts stay 0.
    ``step_bs1`` holds the decode steps that ran at batch size 1 (the baseline of batch sharing)
    and ``exec`` the execution-mode counts (``acceptance``)."""

    steps: int = 0
    req_steps: int = 0
    accepted: int = 0
    committed: int = 0
    draft_tokens: int = 0
    ctx_sum: int = 0
    attn_ctx_sum: int = 0  # summed context of the steps that carry a verify attention time (roofline)
    cached_sum: int = 0
    decoded: int = 0  # prefill: tokens decoded inside its batches (a mixed batch's decode rows)
    retractions: int = 0  # prefill: SGLang's retractions of its rows' requests (re-prefills)
    phases: Mapping[str, DurationStats] = field(default_factory=dict)
    step_bs1: Optional[DurationStats] = None
    exec: Mapping[str, Any] = field(default_factory=dict)
    slow: Optional[SlowSteps] = None  # decode: the bucket's slowest steps (``outliers``)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens of a prefill bucket found in the prefix cache (``names.CACHED_TOKENS``)."""
        return self.cached_sum

    def merged(self, other: "BucketState") -> "BucketState":
        phases: dict[str, DurationStats] = {}
        for src in (self.phases, other.phases):
            for p, st in src.items():
                cur = phases.get(p)
                if cur is None:
                    cur = phases[p] = DurationStats()
                cur.merge(st)
        bs1 = None
        for src in (self.step_bs1, other.step_bs1):
            if src is not None:
                bs1 = bs1 or DurationStats()
                bs1.merge(src)
        slow = None
        for src in (self.slow, other.slow):
            if src is not None:
                slow = slow or SlowSteps()
                slow.merge(src)
        return BucketState(**{k: getattr(self, k) + getattr(other, k) for k in COUNTS}, phases=phases,
                           step_bs1=bs1, exec=acc.merge_exec(self.exec, other.exec), slow=slow)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in COUNTS}
        out["phases"] = {p: s.to_state() for p, s in self.phases.items()}
        if self.step_bs1 is not None:
            out["step_bs1"] = self.step_bs1.to_state()
        if self.exec:
            out["exec"] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.exec.items()}
        if self.slow is not None:
            out["slow"] = self.slow.to_state()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BucketState":
        bs1 = d.get("step_bs1")
        return cls(**{k: int(d.get(k, 0)) for k in COUNTS},
                   phases={str(p): DurationStats.from_state(s) for p, s in (d.get("phases") or {}).items()},
                   step_bs1=DurationStats.from_state(bs1) if bs1 else None,
                   exec=acc.merge_exec(d.get("exec") or {}, {}) if d.get("exec") else {},
                   slow=SlowSteps.from_state(d["slow"]) if d.get("slow") is not None else None)


# The exact counts of a bucket: BucketState's integer fields, in declaration order.  They add when
# ranks merge, cross the control channel as they are, and the aggregator's accumulator has one slot each.
COUNTS: tuple[str, ...] = tuple(f.name for f in fields(BucketState) if f.type == "int")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One rank's aggregate, or several ranks merged.  Bucket maps are keyed by bucket index."""

    bucketing: Mapping[str, Any]
    records: int = 0
    algorithms: Mapping[str, int] = field(default_factory=dict)
    timing: Optional[str] = None
    hw: Optional[Mapping[str, Any]] = None
    decode: Mapping[int, BucketState] = field(default_factory=dict)
    prefill: Mapping[int, BucketState] = field(default_factory=dict)
    fits: Mapping[str, LinearFit] = field(default_factory=dict)
    requests: tuple[Mapping[str, Any], ...] = ()
    requests_tracked: int = 0
    requests_evicted: int = 0
    requests_aborted: int = 0  # aborted while waiting in SGLang's queue (requests.RequestLog.end)
    requests_aborted_retracted: int = 0  # of those, retracted and waiting to be prefilled again
    retractions_unseen: int = 0  # retractions of requests aborted before their re-prefill (no bucket's)
    schema_version: int = SCHEMA_VERSION
    # Per bucket of each request's OWN context: (budget, correct drafts) counts (``acceptance``).
    acceptance: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    # Host time between consecutive steps, and inside run_batch outside the model call (ms).
    host_gaps: DurationStats = field(default_factory=DurationStats)
    host_in_step: DurationStats = field(default_factory=DurationStats)
    # Sampled (ctx_sum/1k, ms) points per phase, for the robust (Theil-Sen) context fit.
    fit_points: Mapping[str, PointSample] = field(default_factory=dict)

    def with_hw(self, hw: Optional[Mapping[str, Any]]) -> "Snapshot":
        return replace(self, hw=hw)

    def to_dict(self, dicts: Optional["PartDicts"] = None) -> dict[str, Any]:
        """Builtins; with ``dicts``, a bucket written before (the same object) is not written again."""
        if dicts is None:
            decode = {str(i): b.to_dict() for i, b in self.decode.items()}
            prefill = {str(i): b.to_dict() for i, b in self.prefill.items()}
        else:
            decode, prefill = dicts.buckets(self.decode, "d"), dicts.buckets(self.prefill, "p")
        return {
            "schema_version": self.schema_version,
            "bucketing": dict(self.bucketing),
            "records": self.records,
            "meta": {"algorithms": dict(self.algorithms), "timing": self.timing, "hw": self.hw},
            "decode": decode,
            "prefill": prefill,
            "fits": {p: f.to_state() for p, f in self.fits.items()},
            "requests": [dict(r) for r in self.requests],
            "requests_tracked": self.requests_tracked,
            "requests_evicted": self.requests_evicted,
            "requests_aborted": self.requests_aborted,
            "requests_aborted_retracted": self.requests_aborted_retracted,
            "retractions_unseen": self.retractions_unseen,
            "acceptance": {str(i): dict(c) for i, c in self.acceptance.items()},
            "host_gaps": self.host_gaps.to_state(),
            "host_in_step": self.host_in_step.to_state(),
            "fit_points": {p: s.to_state() for p, s in self.fit_points.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Snapshot":
        """Read a state dict; raises ValueError naming what is wrong with it."""
        try:
            meta = d.get("meta") or {}
            reqs = tuple(d.get("requests") or ())
            return cls(
                bucketing=dict(d["bucketing"]),
                records=int(d.get("records", 0)),
                algorithms={str(a): int(n) for a, n in (meta.get("algorithms") or {}).items()},
                timing=meta.get("timing"),
                hw=meta.get("hw"),
                decode={int(k): BucketState.from_dict(b) for k, b in (d.get("decode") or {}).items()},
                prefill={int(k): BucketState.from_dict(b) for k, b in (d.get("prefill") or {}).items()},
                fits={str(p): LinearFit.from_state(f) for p, f in (d.get("fits") or {}).items()},
                requests=reqs,
                requests_tracked=int(d.get("requests_tracked", len(reqs))),
                requests_evicted=int(d.get("requests_evicted", 0)),
                requests_aborted=int(d.get("requests_aborted", 0)),
                requests_aborted_retracted=int(d.get("requests_aborted_retracted", 0)),
                retractions_unseen=int(d.get("retractions_unseen", 0)),
                schema_version=int(d.get("schema_version", SCHEMA_VERSION)),
                acceptance={int(i): {str(k): int(v) for k, v in c.items()}
                            for i, c in (d.get("acceptance") or {}).items()},
                host_gaps=DurationStats.from_state(d.get("host_gaps") or {}),
                host_in_step=DurationStats.from_state(d.get("host_in_step") or {}),
                fit_points={str(p): PointSample.from_state(s) for p, s in (d.get("fit_points") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a ctx profile state: {type(exc).__name__}: {exc}") from exc


class PartDicts:
    """The state dicts of the bucket copies last written, by bucket: a bucket whose copy is the very
    object written last time (an unchanged bucket, ``aggregator._Bucket.frozen``) gives the same
    dict again.  Writing a rank's state on every profile read runs on SGLang's scheduler thread, and
    a server streaming at one context changes one or two buckets between reads.  Holds one entry per
    bucket (buckets are never removed; a reset starts a new one); one writer at a time (the caller
    holds the aggregator lock)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], tuple[BucketState, dict[str, Any]]] = {}

    def buckets(self, table: Mapping[int, BucketState], kind: str) -> dict[str, dict[str, Any]]:
        last = self._last
        out: dict[str, dict[str, Any]] = {}
        for i, b in table.items():
            hit = last.get((kind, i))
            if hit is None or hit[0] is not b:
                hit = last[(kind, i)] = (b, b.to_dict())
            out[str(i)] = hit[1]
        return out


def merge(snapshots: Iterable[Snapshot], bucketing: Optional[Mapping[str, Any]] = None) -> Snapshot:
    """Merge rank snapshots (same bucketing) into one.  Requests seen by several DP ranks never
    overlap (TP ranks do not answer), so their lists concatenate."""
    snaps = list(snapshots)
    if not snaps:
        return Snapshot(bucketing=bucketing or Bucketing.parse("pow2").to_dict())
    decode: dict[int, BucketState] = {}
    prefill: dict[int, BucketState] = {}
    fits: dict[str, LinearFit] = {}
    algs: dict[str, int] = {}
    accept: dict[int, dict[str, int]] = {}
    gaps, in_step = DurationStats(), DurationStats()
    points: dict[str, PointSample] = {}
    for s in snaps:
        for i, c in s.acceptance.items():
            accept[i] = acc.merge_counts(accept.get(i, {}), c)
        gaps.merge(s.host_gaps)
        in_step.merge(s.host_in_step)
        for p, ps in s.fit_points.items():
            if p in points:
                points[p].merge(ps)
            else:
                points[p] = ps.copy()
        for a, n in s.algorithms.items():
            algs[a] = algs.get(a, 0) + n
        for dst, src in ((decode, s.decode), (prefill, s.prefill)):
            for i, b in src.items():
                dst[i] = dst[i].merged(b) if i in dst else b.merged(BucketState())
        for p, f in s.fits.items():
            fits.setdefault(p, LinearFit()).merge(f)
    return Snapshot(
        bucketing=snaps[0].bucketing,
        records=sum(s.records for s in snaps),
        algorithms=algs,
        timing=max((s.timing for s in snaps if s.timing), key=lambda t: TIMING_RANK.get(t, 0), default=None),
        hw=next((s.hw for s in snaps if s.hw), None),
        decode=decode, prefill=prefill, fits=fits,
        requests=tuple(r for s in snaps for r in s.requests),
        requests_tracked=sum(s.requests_tracked for s in snaps),
        requests_evicted=sum(s.requests_evicted for s in snaps),
        requests_aborted=sum(s.requests_aborted for s in snaps),
        requests_aborted_retracted=sum(s.requests_aborted_retracted for s in snaps),
        retractions_unseen=sum(s.retractions_unseen for s in snaps),
        acceptance=accept, host_gaps=gaps, host_in_step=in_step, fit_points=points,
    )
