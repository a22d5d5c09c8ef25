"""Pure aggregation of step records by context-length bucket.

``Aggregator.observe(record)`` folds one :class:`~sglang_ctxprof.model.records.StepRecord` into:

* per decode bucket (keyed by the batch's *mean* context entering the step) and per phase:
  count, mean, p50, p90, p99 and total (bounded log histograms, see ``stats``);
* per decode bucket: steps, request-steps, accepted and committed tokens, draft tokens;
* per phase: a least-squares fit of phase ms against the batch's *summed* context in thousands
  of tokens (the KV the step attends over), so ``slope`` reads "ms per extra 1k tokens of context";
* per phase also a bounded sample of the same points, for a robust (Theil-Sen) fit;
* per bucket of each *request's own* context: acceptance by draft position (``acceptance``);
* per decode bucket: the execution-mode fingerprint and the steps that ran at batch size 1;
* host gaps between consecutive steps and host time inside a step outside the model call;
* prefill batches in their own buckets, by prompt length, with the cached part (never mixed into decode),
  and the re-prefills of retracted requests (a prefill bucket's ``committed``: one token each);
* the one bounded per-request history (``requests``): ``/ctx_profile/requests`` serves it and the
  exporters read each finished request from it; a request aborted while it waited in SGLang's queue
  ends there too (``end_request``), and is counted (``requests_aborted``);
* one ring of recent steps (``recent``: typed rows, the last ``MAX_TRACE_STEPS`` with their records),
  from which ``waterfall`` charges a request's wall time and the trace export reads;
* the live self-audit of every record against the engine's books and our own (``audit``).

``snapshot()`` returns a frozen :class:`~.snapshot.Snapshot` with exact counts; ``state()`` is its
builtins form (str keys, msgpack-safe).  ``views/profile`` turns a snapshot, or several ranks'
merged, into the public ``/ctx_profile`` body.  Memory is bounded whatever the run length.
Imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from collections import deque
from itertools import compress
from operator import not_
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..model.buckets import Bucketing
from ..model.names import ABORT_RETRACTED, AUDIT_INVARIANTS, KIND_DECODE, TIMING_RANK, Phase
from ..model.records import HostGap, PhaseShapes, RequestEnd, StepRecord
from ..model.stats import DurationStats, LinearFit, PointSample
from . import acceptance as acc
from .audit import Audit
from .outliers import SlowSteps
from .recent import RecentSteps
from .requests import RequestLog
from .waterfall import waterfall
from .snapshot import COUNTS, BucketState, PartDicts, Snapshot, merge

_ATTN, _PREFILL = Phase.VERIFY_ATTN.value, Phase.PREFILL.value
MAX_RETIRED = 4  # request histories resets retired that wait for the sinks at most (a stalled sink)
# A decode phase's folds: its bucket histogram's add, its fit's and its point sample's.
_Adds = tuple[Callable[[float], None], Callable[[float, float], None], Callable[[float, float], None]]


class _Bucket:
    """Mutable accumulator behind one :class:`~.snapshot.BucketState`: one slot per count, plus the
    phase histograms, the batch-1 baseline, the execution modes and the slowest steps."""

    __slots__ = COUNTS + ("phases", "step_bs1", "exec", "slow", "fold", "_frozen")

    def __init__(self) -> None:
        for k in COUNTS:
            setattr(self, k, 0)
        self.phases: dict[str, DurationStats] = {}
        self.step_bs1: DurationStats | None = None
        self.exec: dict[str, Any] = {}
        self.slow: SlowSteps | None = None  # decode: the slowest steps (outliers)
        self.fold: dict[str, _Adds] = {}  # phase -> its folds (``Aggregator._fold``)
        self._frozen: tuple[int, BucketState] | None = None  # (steps, the copy made at that count)

    def frozen(self) -> BucketState:
        """An immutable copy, made again only when the bucket has taken a step since the last one
        (every change to a bucket comes with a record that counts a step in it; a snapshot is taken
        between whole records).  Between reads of a server streaming at one context, the other
        buckets' copies, and their state dicts (``snapshot.PartDicts``), are reused."""
        f = self._frozen
        if f is not None and f[0] == self.steps:
            return f[1]
        st = BucketState(**{k: getattr(self, k) for k in COUNTS},
                           phases={p: s.copy() for p, s in self.phases.items()},
                           step_bs1=self.step_bs1.copy() if self.step_bs1 is not None else None,
                           exec=acc.merge_exec(self.exec, {}),
                           slow=self.slow.copy() if self.slow is not None else None)
        self._frozen = (self.steps, st)
        return st


class Aggregator:
    def __init__(self, bucketing: Bucketing | None = None, request_capacity: int = 4096,
                 max_steps_per_request: int = 4096, audit: bool = True) -> None:
        self.bucketing = bucketing or Bucketing.parse("pow2")
        self._request_capacity = request_capacity
        self._max_steps = max_steps_per_request
        self._audit = audit
        self.resets = -1  # resets so far (the first is the one below): a state's version names it
        self.counts = acc.CountsMemo()  # each record's acceptance counts, kept for the live metrics' read
        self._violations = dict.fromkeys(AUDIT_INVARIANTS, 0)  # the audit's counts, never reset
        self.retired: deque[RequestLog] = deque()  # histories resets retired, for the sinks (``reset``)
        self.retired_dropped = 0  # ... let go of before the sinks had read them (MAX_RETIRED)
        self._owed = 0  # markers (``drop_retired`` calls) still to come for histories already let go of
        self.reset()

    def reset(self) -> None:
        """Empty the profile.  The request history before it stays readable by
        :meth:`finished_request` alone (``retired``, oldest first: the sinks, a few records behind,
        still export the requests that finished before the reset) until :meth:`drop_retired`."""
        self.resets += 1
        if hasattr(self, "requests"):
            self.retired.append(self.requests)
            if len(self.retired) > MAX_RETIRED:  # sinks stalled over many resets: the oldest goes,
                self.retired.popleft()  # and its reset's marker lets go of nothing
                self.retired_dropped += 1
        self.decode: dict[int, _Bucket] = {}
        self.prefill: dict[int, _Bucket] = {}
        self.fits: dict[str, LinearFit] = {}
        self.requests = RequestLog(self._request_capacity, self._max_steps)
        self.meta: dict[str, Any] = {"algorithms": {}, "timing": None}
        self.records = 0
        self.retractions_unseen = 0
        self.acceptance: dict[int, dict[str, int]] = {}
        self.points: dict[str, PointSample] = {}
        self.host_gaps = DurationStats()
        self.host_in_step = DurationStats()
        self.ring = RecentSteps()  # the one history of recent steps (waterfall and trace export)
        self._gap = HostGap()
        self.decode_steps = 0  # decode records seen: the server's decode-step ordinal of the next one
        self.audit = Audit(lifetime=self._violations) if self._audit else None
        self._shapes: PhaseShapes = {}  # phases_ms keys -> what ``reported_phases`` reads
        self._dicts = PartDicts()  # the state dicts of the buckets' copies, while they are unchanged

    def observe(self, rec: StepRecord) -> None:
        for _ in self.stages(rec):
            pass

    def audit_lifetime(self) -> Mapping[str, int] | None:
        """The audit's violations per invariant since start, across resets (a Prometheus counter's
        count); None with the audit off.  ``audit.counts`` restart at each reset."""
        return self._violations if self.audit is not None else None

    def stages(self, rec: StepRecord) -> Iterator[None]:
        """``observe`` in stages, yielding between two (a decode record's bucket counts, its acceptance
        counts, then its phase histograms and fits; the request history a chunk of requests at a time,
        then the rows it sheds; the audit), so the
        drain thread can hand the GIL over within a record.  Exhausting it is ``observe``; the caller exhausts it before the next
        record (``Recorder`` keeps a started record first in its queue, so a read finishes it first)."""
        self.records += 1
        if not rec.rids:
            return
        self.ring.add(rec)
        cur = self.meta["timing"]
        if rec.timing != cur and (cur is None or TIMING_RANK.get(rec.timing, 0) >= TIMING_RANK.get(cur, 0)):
            self.meta["timing"] = rec.timing  # steps differ (graph, eager, sampled): keep the best seen
        algs = self.meta["algorithms"]
        algs[rec.algorithm] = algs.get(rec.algorithm, 0) + 1
        table = self.decode if rec.kind == KIND_DECODE else self.prefill
        lens = rec.bucket_lens  # a prefill's prompts (a mixed batch's decode rows are none)
        ctx_sum = sum(lens)  # one pass over the requests' lengths, used four times below
        idx = self.bucketing.index(ctx_sum / len(lens))
        b = table.get(idx)
        if b is None:
            b = table[idx] = _Bucket()
        if rec.kind == KIND_DECODE:
            if b.slow is None:
                b.slow = SlowSteps()
            b.slow.add(rec.step_ms, self.decode_steps, b.steps, rec.phases_ms)
            self.decode_steps += 1
        b.steps += 1
        if rec.kind == KIND_DECODE:
            b.req_steps += len(lens)
            b.ctx_sum += ctx_sum
        else:  # a chunked prompt is one request of its prompt: counted at the row that starts its prefill
            starts = self.requests.prefill_starts(rec)
            b.req_steps += sum(starts)
            b.ctx_sum += sum(compress(lens, starts))
        self._host_time(rec)
        if rec.kind == KIND_DECODE:
            yield  # the acceptance counts (one C-level count over the batch, the longest piece before the folds)
            self._decode_extras(b, rec)
            b.accepted += sum(rec.accepted)
            b.committed += sum(rec.committed)
            b.draft_tokens += rec.draft_tokens * rec.batch_size
            yield  # the phase folds are a stage of their own (the longest piece of a small batch)
            x = ctx_sum / 1000.0
            ph = rec.phases_ms
            if _ATTN in ph:
                b.attn_ctx_sum += ctx_sum
            fold = b.fold
            for name, ms in rec.reported_phases(self._shapes):
                adds = fold.get(name)
                if adds is None:
                    adds = fold[name] = self._fold(b, name)
                adds[0](ms)
                adds[1](x, ms)
                adds[2](x, ms)
            b._frozen = None  # the folds came a stage after the step count: a copy made between is stale
        else:
            self._stat(b, _PREFILL).add(rec.step_ms)
            b.cached_sum += rec.cached_tokens
            if any(rec.accepted):  # a mixed batch: its decode rows (accepted) decoded their tokens
                reprefilled = sum(compress(rec.committed, map(not_, rec.accepted)))
                b.decoded += sum(compress(rec.committed, rec.accepted))
            else:
                reprefilled = sum(rec.committed)  # re-prefills after a retraction: one token each
            b.committed += reprefilled
            b.retractions += sum(rec.retractions) if rec.retractions else reprefilled  # a record saved without
        yield
        yield from self.requests.stages(rec)
        if self.audit is not None:
            yield
            yield from self.audit.stages(rec, self.requests)

    def interrupt(self) -> None:
        """Steps went unrecorded (profiling stopped, or a step was lost): the running requests miss
        steps (``RequestLog.interrupt``), and the next step's host gap is not measured (the server
        ran steps meanwhile)."""
        self.requests.interrupt()
        self._gap.brk()

    def end_request(self, end: RequestEnd) -> None:
        """A request SGLang aborted while it waited (no step will say it finished); its retractions
        that no re-prefill counted are counted here (``retractions_unseen``: in no prefill bucket)."""
        self.retractions_unseen += self.requests.end(end)

    def _host_time(self, rec: StepRecord) -> None:
        """Host gap since the previous step's end, host time in the step outside the model call."""
        gap = self._gap.take(rec)
        if gap is not None:
            self.host_gaps.add(gap)
        if rec.t_start_ns and rec.t_end_ns:
            self.host_in_step.add(max(0.0, (rec.t_end_ns - rec.t_start_ns) / 1e6 - rec.step_ms))

    def _decode_extras(self, b: _Bucket, rec: StepRecord) -> None:
        """Execution mode, the batch-1 baseline, and acceptance by position keyed by own context."""
        if not b.exec:
            b.exec = acc.new_exec()
        acc.add_exec(b.exec, rec.exec_mode, rec.attn_backend, rec.exec_reason)
        if rec.batch_size == 1:
            if b.step_bs1 is None:
                b.step_bs1 = DurationStats()
            b.step_bs1.add(rec.step_ms)
        for (i, budget, correct), n in self.counts(rec, self.bucketing.edges).items():
            counts = self.acceptance.get(i)
            if counts is None:
                counts = self.acceptance[i] = {}
            acc.add(counts, budget, correct, n)

    def waterfall(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Where one request's wall time went (``waterfall``), from its summary with step rows."""
        bs1 = {i: b.step_bs1.mean for i, b in self.decode.items() if b.step_bs1 is not None and b.step_bs1.count}
        return waterfall(request.get("step_rows") or [], self.ring, bs1, self.bucketing)

    def _fold(self, b: _Bucket, name: str) -> _Adds:
        """The three folds of one decode phase of bucket ``b``: its histogram, the phase's fit and
        its point sample (resolved once per bucket and phase, not per record)."""
        fit = self.fits.get(name)
        if fit is None:
            fit = self.fits[name] = LinearFit()
        pts = self.points.get(name)
        if pts is None:
            pts = self.points[name] = PointSample()
        return self._stat(b, name).add, fit.add, pts.add

    @staticmethod
    def _stat(b: _Bucket, name: str) -> DurationStats:
        s = b.phases.get(name)
        if s is None:
            s = b.phases[name] = DurationStats()
        return s

    def request(self, rid: str, lazy: bool = False, with_steps: bool = True) -> dict[str, Any] | None:
        """One request's summary with its step rows (none unless ``with_steps``), or None (the
        exporters read finished requests here, ``lazy``: rows built only if read)."""
        return self.requests.get(rid, lazy, with_steps)

    def finished_request(self, rid: str, stamp: int, lazy: bool = False,
                         with_steps: bool = True) -> dict[str, Any] | None:
        """The summary of the use of ``rid`` that the record or end stamped ``stamp`` finished
        (``RequestLog.finished``): what the exporters read, behind the aggregator by a few records,
        in which the rid may have been used again; before a reset, in the history it retired."""
        r = self.requests.finished(rid, stamp, lazy, with_steps)
        for old in reversed(self.retired):
            if r is not None:
                break
            r = old.finished(rid, stamp, lazy, with_steps)
        return r

    def drop_retired(self) -> None:
        """Let go of the oldest history a reset retired (the sinks have seen every record before it)."""
        if self._owed < self.retired_dropped:
            self._owed += 1
        elif self.retired:
            self.retired.popleft()

    def request_with_waterfall(self, rid: str) -> dict[str, Any] | None:
        """The summary served by ``/ctx_profile/requests/{rid}``: step rows plus the waterfall."""
        r = self.requests.get(rid)
        if r is not None:
            r["waterfall"] = self.waterfall(r)
        return r

    @property
    def recent(self) -> list[StepRecord]:
        """The last ``MAX_TRACE_STEPS`` records with requests, oldest first."""
        return self.ring.records()

    def recent_steps(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` (at most ``MAX_TRACE_STEPS``) records with requests, oldest first, as dicts."""
        return [r.to_dict() for r in self.ring.records(n)]

    def recent_steps_json(self, n: int) -> tuple[list[str], int]:
        """``recent_steps(n)`` as JSON texts, one per row, and the older steps left out by the bound on
        their request rows (``RecentSteps.json_rows``: each written once)."""
        return self.ring.json_rows(n)

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
            requests_aborted=self.requests.aborted,
            requests_aborted_retracted=self.requests.aborted_by[ABORT_RETRACTED],
            retractions_unseen=self.retractions_unseen,
            acceptance={i: dict(c) for i, c in self.acceptance.items()},
            host_gaps=self.host_gaps.copy(), host_in_step=self.host_in_step.copy(),
            fit_points={p: s.copy() for p, s in self.points.items()},
        )

    def state(self, with_request_steps: bool = False, with_requests: bool = True,
              hw: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``snapshot(...).with_hw(hw).to_dict()``: the builtins that cross the control channel.  A
        bucket unchanged since the last state gives the same dict object as then (``PartDicts``):
        read it, never change it."""
        snap = self.snapshot(with_request_steps, with_requests)
        return (snap.with_hw(hw) if hw is not None else snap).to_dict(self._dicts)


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge rank state dicts (same bucketing) into one; histograms, counts and fit sums add exactly."""
    return merge([Snapshot.from_dict(s) for s in states]).to_dict()
