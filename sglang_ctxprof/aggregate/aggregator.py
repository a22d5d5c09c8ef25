"""Pure aggregation of step records by context-length bucket.

``Aggregator.observe(record)`` folds one :class:`~sglang_ctxprof.model.records.StepRecord` into:

* per decode bucket (keyed by the batch's *mean* context entering the step) and per phase:
  count, mean, p50, p90, p99 and total (bounded log histograms, see ``stats``);
* per decode bucket: steps, request-steps, accepted and committed tokens, draft tokens;
* per phase: a least-squares fit of phase ms against the batch's *summed* context in thousands
  of tokens (the KV the step attends over), so ``slope`` reads "ms per extra 1k tokens of context";
* prefill batches in their own buckets (never mixed into decode);
* a bounded request log.

``state()`` exports mergeable builtins (str keys, msgpack-safe) and ``summarize(state)`` turns one
state, or ``merge_states`` of several ranks, into the public ``/ctx_profile`` JSON, with verify
attention's % of the HBM roofline per bucket when the state's ``meta["hw"]`` allows (``roofline``).  Memory is
bounded whatever the run length.  Imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..model.buckets import Bucketing
from ..model.names import KIND_DECODE, LEAF_PHASES, REPORTED_PHASES, SCHEMA_VERSION, Phase
from ..model.records import StepRecord
from .requests import RequestLog, merge_request_lists
from ..model.roofline import bucket_roofline
from ..model.stats import DurationStats, LinearFit


class _Bucket:
    __slots__ = ("steps", "req_steps", "accepted", "committed", "draft_tokens", "ctx_sum", "phases")

    def __init__(self) -> None:
        self.steps = 0
        self.req_steps = 0
        self.accepted = 0
        self.committed = 0
        self.draft_tokens = 0
        self.ctx_sum = 0
        self.phases: dict[str, DurationStats] = {}

    def to_state(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "req_steps": self.req_steps,
            "accepted": self.accepted,
            "committed": self.committed,
            "draft_tokens": self.draft_tokens,
            "ctx_sum": self.ctx_sum,
            "phases": {p: s.to_state() for p, s in self.phases.items()},
        }


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

    def observe(self, rec: StepRecord) -> None:
        self.records += 1
        if not rec.rids:
            return
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

    def state(self, with_request_steps: bool = False, with_requests: bool = True) -> dict[str, Any]:
        """Mergeable state.  ``with_requests=False`` leaves out the per-request list (the snapshot
        behind ``GET /ctx_profile`` only needs its length; requests are served by their own route)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "bucketing": self.bucketing.to_dict(),
            "records": self.records,
            "meta": {"algorithms": dict(self.meta["algorithms"]), "timing": self.meta["timing"]},
            "decode": {str(i): b.to_state() for i, b in self.decode.items()},
            "prefill": {str(i): b.to_state() for i, b in self.prefill.items()},
            "fits": {p: f.to_state() for p, f in self.fits.items()},
            "requests": self.requests.to_state(with_steps=with_request_steps) if with_requests else [],
            "requests_tracked": len(self.requests),
            "requests_evicted": self.requests.evicted,
        }


# ---------------------------------------------------------------------------------------- merge
def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge rank states (same bucketing) into one state.  Histograms and fit sums add exactly."""
    states = list(states)
    if not states:
        return Aggregator().state()
    out_decode: dict[str, dict[str, Any]] = {}
    out_prefill: dict[str, dict[str, Any]] = {}
    fits: dict[str, LinearFit] = {}
    algs: dict[str, int] = {}
    timing = None
    hw = None
    records = 0
    for s in states:
        records += int(s.get("records", 0))
        timing = timing or (s.get("meta") or {}).get("timing")
        hw = hw or (s.get("meta") or {}).get("hw")
        for a, n in ((s.get("meta") or {}).get("algorithms") or {}).items():
            algs[a] = algs.get(a, 0) + n
        for dst, src in ((out_decode, s.get("decode") or {}), (out_prefill, s.get("prefill") or {})):
            for k, b in src.items():
                _merge_bucket(dst.setdefault(k, _empty_bucket_state()), b)
        for p, f in (s.get("fits") or {}).items():
            fits.setdefault(p, LinearFit()).merge(LinearFit.from_state(f))
    return {
        "schema_version": SCHEMA_VERSION,
        "bucketing": states[0]["bucketing"],
        "records": records,
        "meta": {"algorithms": algs, "timing": timing, "hw": hw},
        "decode": out_decode,
        "prefill": out_prefill,
        "fits": {p: f.to_state() for p, f in fits.items()},
        "requests": merge_request_lists(s.get("requests") or [] for s in states),
        "requests_evicted": sum(int(s.get("requests_evicted", 0)) for s in states),
        "requests_tracked": sum(int(s.get("requests_tracked", len(s.get("requests") or []))) for s in states),
    }


def _empty_bucket_state() -> dict[str, Any]:
    return {"steps": 0, "req_steps": 0, "accepted": 0, "committed": 0, "draft_tokens": 0,
            "ctx_sum": 0, "phases": {}}


def _merge_bucket(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k in ("steps", "req_steps", "accepted", "committed", "draft_tokens", "ctx_sum"):
        dst[k] += int(src.get(k, 0))
    for p, st in (src.get("phases") or {}).items():
        cur = DurationStats.from_state(dst["phases"][p]) if p in dst["phases"] else DurationStats()
        cur.merge(DurationStats.from_state(st))
        dst["phases"][p] = cur.to_state()


# ------------------------------------------------------------------------------------ summarize
def summarize(state: Mapping[str, Any]) -> dict[str, Any]:
    """Public view of a (merged) state: the documented ``/ctx_profile`` JSON body (without envelope)."""
    bk = Bucketing.from_dict(state["bucketing"])
    hw = (state.get("meta") or {}).get("hw")
    buckets = []
    for key in sorted(state.get("decode") or {}, key=int):
        b = state["decode"][key]
        i = int(key)
        lo, hi = bk.bounds(i)
        phases = {p: DurationStats.from_state(st).summary() for p, st in b["phases"].items()}
        phases = {p: phases[p] for p in REPORTED_PHASES if p in phases}
        steps = b["steps"]
        step_mean_s = phases.get(Phase.STEP.value, {}).get("mean_ms", 0.0) / 1e3
        acc_per_req_step = b["accepted"] / b["req_steps"] if b["req_steps"] else 0.0
        com_per_req_step = b["committed"] / b["req_steps"] if b["req_steps"] else 0.0
        buckets.append({
            "label": bk.label(i), "lo": lo, "hi": hi,
            "steps": steps,
            "mean_batch_size": b["req_steps"] / steps if steps else 0.0,
            "mean_ctx": b["ctx_sum"] / b["req_steps"] if b["req_steps"] else 0.0,
            "accepted_per_step": acc_per_req_step,
            "committed_per_step": com_per_req_step,
            "draft_tokens_per_step": b["draft_tokens"] / b["req_steps"] if b["req_steps"] else 0.0,
            "decode_tok_s": acc_per_req_step / step_mean_s if step_mean_s > 0 else 0.0,
            "batch_tok_s": (b["accepted"] / steps) / step_mean_s if steps and step_mean_s > 0 else 0.0,
            "phases": phases,
            "roofline": bucket_roofline(hw, b["ctx_sum"] / steps if steps else 0.0,
                                        phases.get(Phase.VERIFY_ATTN.value, {}).get("mean_ms")),
        })
    prefill = []
    for key in sorted(state.get("prefill") or {}, key=int):
        b = state["prefill"][key]
        i = int(key)
        lo, hi = bk.bounds(i)
        st = DurationStats.from_state(b["phases"].get(Phase.PREFILL.value, {}))
        prefill.append({"label": bk.label(i), "lo": lo, "hi": hi, "batches": b["steps"],
                        "requests": b["req_steps"], "tokens": b["ctx_sum"], **st.summary()})
    fits = {}
    for p in REPORTED_PHASES:
        f = (state.get("fits") or {}).get(p)
        sol = LinearFit.from_state(f).solve() if f else None
        if sol is not None:
            fits[p] = {"ms_per_1k_ctx": sol["slope"], "intercept_ms": sol["intercept"],
                       "r2": sol["r2"], "n": sol["n"]}
    reqs = state.get("requests") or []
    totals = {
        "records": state.get("records", 0),
        "decode_steps": sum(b["steps"] for b in (state.get("decode") or {}).values()),
        "prefill_batches": sum(b["steps"] for b in (state.get("prefill") or {}).values()),
        "accepted": sum(b["accepted"] for b in (state.get("decode") or {}).values()),
        "committed": sum(b["committed"] for b in (state.get("decode") or {}).values()),
        "requests_tracked": int(state.get("requests_tracked", len(reqs))),
        "requests_evicted": state.get("requests_evicted", 0),
    }
    meta = state.get("meta") or {}
    return {
        "schema_version": SCHEMA_VERSION,
        "timing": meta.get("timing"),
        "hw": hw,
        "algorithms": sorted((meta.get("algorithms") or {}).keys()),
        "phases": list(REPORTED_PHASES),
        "leaf_phases": list(LEAF_PHASES),
        "bucketing": bk.to_dict(),
        "buckets": buckets,
        "prefill": prefill,
        "fits": fits,
        "totals": totals,
    }
