"""Typed, immutable records that cross every boundary of the data path.

A :class:`StepRecord` is what the hooks produce for one scheduler step (a speculative decode step
or a prefill/extend batch) once its timings and acceptance are known.  It serialises to builtins
(``to_dict``/``from_dict``) so it can travel through SGLang's msgpack control channel, be written
to disk and be read back by the CLI.

Accounting rule (documented in the README): for a request, ``1 + sum(committed)`` equals SGLang's
``completion_tokens`` (the first token comes from prefill), the number of decode records equals
``meta_info.spec_verify_ct``, and ``sum(accepted) - sum(committed)`` is what SGLang dropped at the
request's last step (``max_new_tokens`` or a stop condition).

Imports nothing from SGLang, torch or OTel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .names import KIND_DECODE, KIND_PREFILL, LEAF_PHASES, Phase


@dataclass(frozen=True, slots=True)
class RankId:
    tp: int = 0
    dp: int = 0
    pp: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "RankId":
        d = d or {}
        return cls(int(d.get("tp", 0) or 0), int(d.get("dp", 0) or 0), int(d.get("pp", 0) or 0))

    @property
    def label(self) -> str:
        return f"tp{self.tp}-dp{self.dp}-pp{self.pp}"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step.  Times are milliseconds; ``phases_ms`` holds leaf phases plus ``verify``."""

    step_id: int
    kind: str
    algorithm: str
    rank: RankId
    rids: tuple[str, ...]
    ctx_lens: tuple[int, ...]
    accepted: tuple[int, ...]
    committed: tuple[int, ...]
    finished: tuple[bool, ...]
    draft_tokens: int
    step_ms: float
    phases_ms: Mapping[str, float] = field(default_factory=dict)
    t_start_ns: int = 0
    timing: str = "cpu"
    # W3C traceparent per request (aligned with rids) or () when none is known.  Filled on prefill
    # records only, from SGLang's own trace context (``--enable-trace``); see adapter.req_trace_parent.
    trace_parents: tuple[str, ...] = ()
    # Block drafters (names.BLOCK_ALGORITHMS): positions in the step's draft block including its
    # anchor (the last committed token), and the draft model forward passes that proposed it
    # (denoising / selection steps); 0 = not a block drafter or unknown.
    block_size: int = 0
    denoise_steps: int = 0
    # Tokens of ``accepted`` that are not accepted drafts: the bonus token (1), and UNO's clean
    # root as well (2); SGLang's ``num_non_draft_tokens_per_req``.
    non_draft_tokens: int = 1

    @property
    def accepted_drafts(self) -> tuple[int, ...]:
        """Per request: draft positions accepted this step, i.e. the accepted prefix of the draft
        (chain or block) after its anchor; position i (1-based) was accepted iff i <= this."""
        return tuple(max(0, a - self.non_draft_tokens) for a in self.accepted)

    @property
    def draft_positions(self) -> int:
        """Draft positions one request could have accepted this step: the chain or block behind its
        anchor (``draft_tokens - 1``; 0 for a record without a draft)."""
        return max(0, self.draft_tokens - 1)
    # Execution fingerprint of the step: "graph" | "eager" | "piecewise" | "" (unknown), the
    # attention backend, and why verify did not run as a CUDA graph where that is known.
    exec_mode: str = ""
    attn_backend: str = ""
    # Host clock (time.time_ns) when the scheduler's run_batch returned: the gap to the next step's
    # t_start_ns is the scheduler's own time between steps.  0 = unknown (an older record).
    t_end_ns: int = 0
    # The step's draft budget in positions (the most drafts one request can have accepted: the
    # chain length, or the tree depth); 0 = unknown.  Positions beyond it are unobserved.
    draft_depth: int = 0
    exec_reason: str = ""
    # Prefill records: prompt tokens already in the prefix cache per request (aligned with rids).
    cached_lens: tuple[int, ...] = ()
    # The engine's own books of the requests that finished at this step (aligned with rids; () when
    # none did): (``spec_verify_ct`` or -1 without speculative decoding, ``completion_tokens``,
    # ``spec_num_correct_drafts`` or -1 where SGLang keeps none); (-1, -1, -1) for a running request.
    books: tuple[tuple[int, int, int], ...] = ()

    @property
    def batch_size(self) -> int:
        return len(self.rids)

    @property
    def ctx_sum(self) -> int:
        return sum(self.ctx_lens)

    @property
    def ctx_mean(self) -> float:
        return self.ctx_sum / len(self.ctx_lens) if self.ctx_lens else 0.0

    def phase(self, name: str) -> float:
        if name == Phase.STEP.value:
            return self.step_ms
        return float(self.phases_ms.get(name, 0.0))

    def leaf_sum_ms(self) -> float:
        return sum(float(self.phases_ms.get(p, 0.0)) for p in LEAF_PHASES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "kind": self.kind,
            "algorithm": self.algorithm,
            "rank": self.rank.to_dict(),
            "batch_size": self.batch_size,
            "rids": list(self.rids),
            "ctx_lens": list(self.ctx_lens),
            "accepted": list(self.accepted),
            "committed": list(self.committed),
            "finished": list(self.finished),
            "draft_tokens": self.draft_tokens,
            "step_ms": self.step_ms,
            "phases_ms": dict(self.phases_ms),
            "t_start_ns": self.t_start_ns,
            "timing": self.timing,
            "trace_parents": list(self.trace_parents),
            "block_size": self.block_size,
            "denoise_steps": self.denoise_steps,
            "non_draft_tokens": self.non_draft_tokens,
            "exec_mode": self.exec_mode,
            "attn_backend": self.attn_backend,
            "t_end_ns": self.t_end_ns,
            "draft_depth": self.draft_depth,
            "exec_reason": self.exec_reason,
            "cached_lens": list(self.cached_lens),
            "books": [list(b) for b in self.books],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepRecord":
        n = len(d.get("rids", ()))
        return cls(
            step_id=int(d["step_id"]),
            kind=str(d.get("kind", KIND_DECODE)),
            algorithm=str(d.get("algorithm", "")),
            rank=RankId.from_dict(d.get("rank")),
            rids=tuple(str(r) for r in d.get("rids", ())),
            ctx_lens=tuple(int(x) for x in d.get("ctx_lens", ())),
            accepted=tuple(int(x) for x in d.get("accepted", (0,) * n)),
            committed=tuple(int(x) for x in d.get("committed", (0,) * n)),
            finished=tuple(bool(x) for x in d.get("finished", (False,) * n)),
            draft_tokens=int(d.get("draft_tokens", 0)),
            step_ms=float(d.get("step_ms", 0.0)),
            phases_ms={str(k): float(v) for k, v in (d.get("phases_ms") or {}).items()},
            t_start_ns=int(d.get("t_start_ns", 0)),
            timing=str(d.get("timing", "cpu")),
            trace_parents=tuple(str(x) for x in d.get("trace_parents", ()) or ()),
            block_size=int(d.get("block_size", 0) or 0),
            denoise_steps=int(d.get("denoise_steps", 0) or 0),
            non_draft_tokens=int(d.get("non_draft_tokens", 1) or 1),
            exec_mode=str(d.get("exec_mode", "") or ""),
            attn_backend=str(d.get("attn_backend", "") or ""),
            t_end_ns=int(d.get("t_end_ns", 0) or 0),
            draft_depth=int(d.get("draft_depth", 0) or 0),
            exec_reason=str(d.get("exec_reason", "") or ""),
            cached_lens=tuple(int(x) for x in d.get("cached_lens", ()) or ()),
            books=tuple((int(b[0]), int(b[1]), int(b[2])) for b in d.get("books", ()) or ()),
        )


def validate(rec: StepRecord) -> None:
    """Raise ValueError if a record is inconsistent (used by tests and the recorder's debug path)."""
    n = len(rec.rids)
    if rec.kind not in (KIND_DECODE, KIND_PREFILL):
        raise ValueError(f"unknown kind {rec.kind!r}")
    for name in ("ctx_lens", "accepted", "committed", "finished"):
        if len(getattr(rec, name)) != n:
            raise ValueError(f"{name} has {len(getattr(rec, name))} entries for {n} requests")
    if rec.trace_parents and len(rec.trace_parents) != n:
        raise ValueError(f"trace_parents has {len(rec.trace_parents)} entries for {n} requests")
    if rec.books and len(rec.books) != n:
        raise ValueError(f"books has {len(rec.books)} entries for {n} requests")
    if rec.cached_lens and len(rec.cached_lens) != n:
        raise ValueError(f"cached_lens has {len(rec.cached_lens)} entries for {n} requests")
    if rec.step_ms < 0 or any(v < 0 for v in rec.phases_ms.values()):
        raise ValueError("negative duration")
    if rec.block_size < 0 or rec.denoise_steps < 0 or rec.non_draft_tokens < 1:
        raise ValueError("block_size and denoise_steps must be >= 0, non_draft_tokens >= 1")
