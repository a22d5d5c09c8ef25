"""The public profile's bucket views: one :class:`BucketView` per decode context bucket and one
:class:`PrefillView` per prefill bucket, each wrapping the bucket's exact counts
(:class:`~sglang_ctxprof.aggregate.snapshot.BucketState`) with its phase summaries
(:class:`PhaseView`).  Means are derived from the counts on read, so a renderer never rebuilds a
count from a rounded average; ``from_dict`` also reads a body from a server that predates the exact
counts (they are then rebuilt from the means, to the nearest integer).  Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

from ..aggregate.snapshot import COUNTS, BucketState
from ..model.names import CACHED_TOKENS, Phase


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass(frozen=True, slots=True)
class PhaseView:
    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    total_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PhaseView":
        return cls(int(d.get("count", 0)), *(float(d.get(k, 0.0)) for k in
                                            ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "total_ms")))


# The exact counts a public bucket carries beside its means (the rest of COUNTS stays internal).
_EXACT = tuple(k for k in COUNTS if k not in ("steps", "attn_ctx_sum", "cached_sum"))
# Each per-request-step mean of the public body and the count it divides by ``req_steps``; a body
# from a server that predates the exact counts has only the mean (the count is rebuilt from it).
_MEANS = {"mean_ctx": "ctx_sum", "accepted_per_step": "accepted", "committed_per_step": "committed",
          "draft_tokens_per_step": "draft_tokens"}


def _count(name: str, doc: str = "") -> property:
    """A view's read-only window on one count of its wrapped ``state`` (an int)."""
    return property(lambda self: getattr(self.state, name), doc=doc or f"``state.{name}``")


def _per_req_step(name: str, doc: str = "") -> property:
    """One count of the wrapped ``state`` over its request-steps (a float; ``_MEANS``)."""
    return property(lambda self: _div(getattr(self.state, name), self.state.req_steps),
                    doc=doc or f"``state.{name} / state.req_steps``")


@dataclass(frozen=True, slots=True, eq=False)
class BucketView:
    """One decode context bucket of the public profile: its exact counts are the bucket's
    :class:`~sglang_ctxprof.aggregate.snapshot.BucketState` (``state``), never copied; the phases
    are summaries and the rest is derived for the body."""

    label: str
    lo: int
    hi: Optional[int]
    state: BucketState
    phases: Mapping[str, PhaseView]
    roofline: Mapping[str, Any]
    acceptance_by_position: Optional[Mapping[str, Any]] = None  # keyed by each request's own ctx
    exec_mode: Optional[Mapping[str, Any]] = None
    step_bs1_ms: Optional[float] = None  # mean step at batch size 1 (the batch-sharing baseline)
    # Robust means (outlier steps set apart) and the outliers themselves (``aggregate.outliers``).
    robust: Optional[Mapping[str, Any]] = None

    steps = _count("steps")
    req_steps = _count("req_steps")
    accepted = _count("accepted", "Accepted tokens (incl. the bonus token).")
    committed = _count("committed")
    draft_tokens = _count("draft_tokens")
    ctx_sum = _count("ctx_sum")
    mean_ctx = _per_req_step("ctx_sum")
    accepted_per_step = _per_req_step("accepted", "Accepted tokens (incl. the bonus token) per request per step.")
    committed_per_step = _per_req_step("committed")
    draft_tokens_per_step = _per_req_step("draft_tokens")

    @property
    def mean_batch_size(self) -> float:
        return _div(self.req_steps, self.steps)

    def mean_ms(self, phase: str) -> Optional[float]:
        p = self.phases.get(phase)
        return p.mean_ms if p is not None else None

    def robust_ms(self, phase: str) -> Optional[float]:
        """The phase's mean over the bucket's steps without its outliers (the mean without them)."""
        r = self.robust
        if r:
            if phase == Phase.STEP.value:
                return float(r["step_ms"])
            if phase in (r.get("phases") or {}):
                return float(r["phases"][phase])
        return self.mean_ms(phase)

    @property
    def decode_tok_s(self) -> float:
        """One request's decode speed at this context: accepted tokens per request-step over the mean
        step time.  Accepted, not committed: what SGLang drops at a request's last step falls in its
        largest context and would bias this down there (a request's own ``decode_tok_s`` is committed
        tokens over its decode time: what its client got)."""
        step_s = (self.mean_ms(Phase.STEP.value) or 0.0) / 1e3
        return self.accepted_per_step / step_s if step_s > 0 else 0.0

    @property
    def batch_tok_s(self) -> float:
        step_s = (self.mean_ms(Phase.STEP.value) or 0.0) / 1e3
        return _div(self.accepted, self.steps) / step_s if step_s > 0 else 0.0

    def __eq__(self, other: object) -> bool:
        """Views are equal when they state the same body (the wrapped state may hold more)."""
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "lo": self.lo, "hi": self.hi,
            "steps": self.steps,
            "mean_batch_size": self.mean_batch_size,
        } | {mean: getattr(self, mean) for mean in _MEANS} | {
            "decode_tok_s": self.decode_tok_s,
            "batch_tok_s": self.batch_tok_s,
            "phases": {p: v.to_dict() for p, v in self.phases.items()},
            "roofline": dict(self.roofline),
        } | {k: getattr(self.state, k) for k in _EXACT} | {
            k: v for k, v in (("acceptance_by_position", self.acceptance_by_position),
                              ("exec_mode", self.exec_mode), ("step_bs1_ms", self.step_bs1_ms),
                              ("robust", self.robust))
            if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BucketView":
        steps = int(d["steps"])
        req_steps = int(d["req_steps"]) if "req_steps" in d else round(d["mean_batch_size"] * steps)
        counts = {"steps": steps, "req_steps": req_steps}
        for mean, count in _MEANS.items():
            counts[count] = int(d[count]) if count in d else round(float(d.get(mean, 0.0)) * req_steps)
        return cls(str(d["label"]), int(d["lo"]), None if d.get("hi") is None else int(d["hi"]),
                   BucketState(**counts),
                   {str(p): PhaseView.from_dict(v) for p, v in (d.get("phases") or {}).items()},
                   dict(d.get("roofline") or {}), d.get("acceptance_by_position"), d.get("exec_mode"),
                   None if d.get("step_bs1_ms") is None else float(d["step_bs1_ms"]), d.get("robust"))


@dataclass(frozen=True, slots=True, eq=False)
class PrefillView:
    """One prefill bucket (keyed by prompt length): its counts are the bucket's ``state`` under the
    public names ``_PREFILL_NAMES`` gives them."""

    label: str
    lo: int
    hi: Optional[int]
    state: BucketState
    stats: PhaseView

    batches = _count("steps")
    requests = _count("req_steps")
    tokens = _count("ctx_sum", "Prompt tokens.")
    cached_tokens = _count("cached_sum", "Of ``tokens``, those found in the prefix cache (``names.CACHED_TOKENS``).")
    retractions = _count("retractions", "SGLang's retractions (KV pressure) of the requests these batches prefilled again.")
    decoded = _count("decoded", "Tokens running requests decoded inside these batches (mixed chunked prefill).")

    def __eq__(self, other: object) -> bool:
        """Views are equal when they state the same body (the wrapped state may hold more)."""
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "lo": self.lo, "hi": self.hi,
                **{name: getattr(self.state, count) for name, count in _PREFILL_NAMES.items()},
                **self.stats.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PrefillView":
        return cls(str(d["label"]), int(d["lo"]), None if d.get("hi") is None else int(d["hi"]),
                   BucketState(**{count: int(d.get(name, 0)) for name, count in _PREFILL_NAMES.items()}),
                   PhaseView.from_dict(d))


# A prefill bucket's public count names and the BucketState count each one is.
_PREFILL_NAMES = {"batches": "steps", "requests": "req_steps", "tokens": "ctx_sum", CACHED_TOKENS: "cached_sum",
                  "retractions": "retractions", "decoded": "decoded"}
