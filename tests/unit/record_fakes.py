"""Step records built by hand for the view tests: a decode step from its six leaf phase times (in
``LEAVES`` order; verify = its attention, MoE and rest) starting at ``t_ns``, or a prefill step."""

from __future__ import annotations

from sglang_ctxprof.model.records import RankId, StepRecord

LEAVES = ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead")


def trace_rec(i: int, t_ns: int, times, ctx=(100, 300), kind="decode", rank=RankId()) -> StepRecord:
    ph = dict(zip(LEAVES, times))
    ph["verify"] = ph["verify_attn"] + ph["verify_moe"] + ph["verify_rest"]
    n = len(ctx)
    tokens = (3 if kind == "decode" else 0,) * n  # a first prefill commits and accepts none (records.py)
    return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=rank, rids=tuple(f"r{j}" for j in range(n)),
                      ctx_lens=tuple(ctx), accepted=tokens, committed=tokens, finished=(False,) * n,
                      draft_tokens=4, step_ms=sum(times) if kind == "decode" else 7.5,
                      phases_ms=ph if kind == "decode" else {}, t_start_ns=t_ns)
