"""Pure aggregation of step records by context-length bucket.

``Aggregator.observe(record)`` folds one :class:`~sglang_ctxprof.model.records.StepRecord` into:

* per decode bucket (keyed by the batch's *mean* context entering the step) and per phase:
  count, mean, p50, p90, p99 and total (bounded log histograms, see ``stats``);
* per decode bucket: steps, request-steps, accepted and committed tokens, draft tokens;
* per phase: a least-squares fit of phase ms against the batch's *summed* context in thousands
  of tokens (the KV the step attends over), so ``slope`` reads "ms per extra 1k tokens of context";
* prefill batches in their own buckets (never mixed into decode);
* the one bounded per-request history (``requests``): ``/ctx_profile/requests`` serves it and the
  exporters read each finished request from it;
* the last ``MAX_TRACE_STEPS`` records themselves (``recent``, a ring), for the trace export.

``snapshot()`` returns a frozen :class:`~.snapshot.Snapshot` with exact counts; ``state()`` is its
builtins form (str keys, msgpack-safe).  ``views/profile`` turns a snapshot, or several ranks'
merged, into the public ``/ctx_profile`` body.  Memory is bounded whatever the run length.
Imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Mapping

from ..model.buckets import Bucketing
from ..model.names import KIND_DECODE, MAX_TRACE_STEPS, REPORTED_PHASES, Phase
from ..model.records import StepRecord
from ..model.stats import DurationStats, LinearFit
from .requests import RequestLog
from .snapshot import BucketState, Snapshot, merge


class _Bucket:
    """Mutable accumulator behind one :class:`~.snapshot.BucketState`."""

    __slots__ = ("steps", "req_steps", "accepted", "committed", "draft_tokens", "ctx_sum", "phases")

    def __init__(self) -> None:
        self.steps = 0
        self.req_steps = 0
        self.accepted = 0
        self.committed = 0
        self.draft_tokens = 0
        self.ctx_sum = 0
        self.phases: dict[str, DurationStats] = {}

    def frozen(self) -> BucketState:
        return BucketState(self.steps, self.req_steps, self.accepted, self.committed, self.draft_tokens,
                           self.ctx_sum, {p: s.copy() for p, s in self.phases.items()})


class Aggregator:
    def __init__(self, bucketing: Bucketing | None = None, request_capacity: int = 4096,
                 max_steps_per_request: int = 4096) -> None:
        self.bucketing = bucketing or Bucketing.parse("pow2")
        self._request_capacity = request_capacity
        self._max_steps = max_steps_per_request
        self.reset()

    def reset(self) -> None:
        self.decode: dict[int, _Bucket] = {}
        self.prefill: dict[int, _Bucket] = {}
        self.fits: dict[str, LinearFit] = {}
        self.requests = RequestLog(self._request_capacity, self._max_steps)
        self.meta: dict[str, Any] = {"algorithms": {}, "timing": None}
        self.records = 0
        self.recent: "deque[StepRecord]" = deque(maxlen=MAX_TRACE_STEPS)

    def observe(self, rec: StepRecord) -> None:
        self.records += 1
        if not rec.rids:
            return
        self.recent.append(rec)
        self.meta["timing"] = rec.timing
        algs = self.meta["algorithms"]
        algs[rec.algorithm] = algs.get(rec.algorithm, 0) + 1
        table = self.decode if rec.kind == KIND_DECODE else self.prefill
        idx = self.bucketing.index(rec.ctx_mean)
        b = table.get(idx)
        if b is None:
            b = table[idx] = _Bucket()
        b.steps += 1
        b.req_steps += rec.batch_size
        b.ctx_sum += rec.ctx_sum
        if rec.kind == KIND_DECODE:
            b.accepted += sum(rec.accepted)
            b.committed += sum(rec.committed)
            b.draft_tokens += rec.draft_tokens * rec.batch_size
            x = rec.ctx_sum / 1000.0
            for name in REPORTED_PHASES:
                if name != Phase.STEP.value and name not in rec.phases_ms:
                    continue
                ms = rec.phase(name)
                self._stat(b, name).add(ms)
                fit = self.fits.get(name)
                if fit is None:
                    fit = self.fits[name] = LinearFit()
                fit.add(x, ms)
        else:
            self._stat(b, Phase.PREFILL.value).add(rec.step_ms)
        self.requests.observe(rec)

    @staticmethod
    def _stat(b: _Bucket, name: str) -> DurationStats:
        s = b.phases.get(name)
        if s is None:
            s = b.phases[name] = DurationStats()
        return s

    def request(self, rid: str) -> dict[str, Any] | None:
        """One request's summary with its step rows, or None (the exporters read finished requests here)."""
        return self.requests.get(rid)

    def recent_steps(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` (at most ``MAX_TRACE_STEPS``) records with requests, oldest first, as dicts."""
        n = max(0, min(int(n), len(self.recent)))
        return [r.to_dict() for r in list(self.recent)[len(self.recent) - n:]]

    def snapshot(self, with_request_steps: bool = False, with_requests: bool = True) -> Snapshot:
        """A frozen copy.  ``with_requests=False`` leaves out the per-request list (the snapshot
        behind ``GET /ctx_profile`` only needs its length; requests are served by their own route)."""
        return Snapshot(
            bucketing=self.bucketing.to_dict(),
            records=self.records,
            algorithms=dict(self.meta["algorithms"]),
            timing=self.meta["timing"],
            decode={i: b.frozen() for i, b in self.decode.items()},
            prefill={i: b.frozen() for i, b in self.prefill.items()},
            fits={p: f.copy() for p, f in self.fits.items()},
            requests=tuple(self.requests.to_state(with_steps=with_request_steps)) if with_requests else (),
            requests_tracked=len(self.requests),
            requests_evicted=self.requests.evicted,
        )

    def state(self, with_request_steps: bool = False, with_requests: bool = True) -> dict[str, Any]:
        """``snapshot(...).to_dict()``: the builtins that cross the control channel."""
        return self.snapshot(with_request_steps, with_requests).to_dict()


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge rank state dicts (same bucketing) into one; histograms, counts and fit sums add exactly."""
    return merge([Snapshot.from_dict(s) for s in states]).to_dict()
