"""The diagnosis's what-if: predicted tok/s at a context, and the draft budget worth running.

:func:`whatif` predicts the step time at a context from the per-phase fits and takes the acceptance
of the nearest bucket (with the range the data supports, and "extrapolation" outside it), the
speedup if verify attention ran at the roofline (GPU only), and :func:`budget_advice`: the best
draft budget per bucket, measured against a plain baseline where the ledger has one and assumed
(a stated cost per draft position) where it has not.  Pure: imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..model.names import Phase
from ..model.records import leaf_phases
from .diagnosis_evidence import HOST_GAP, Evidence, solid, solid_acceptance

_STEP, _VA, _V = Phase.STEP.value, Phase.VERIFY_ATTN.value, Phase.VERIFY.value


def _predict_step(ev: Evidence, ctx: float) -> Optional[float]:
    """The fitted leaves at ``ctx`` (``records.leaf_phases``: a forward whole where none of its parts
    has a fit, as when it ran in a CUDA graph whose split was not read), else the fitted step."""
    leaves = leaf_phases(ev.fits)
    if _STEP in ev.fits and not leaves:
        return ev.fits[_STEP][1] + ev.fits[_STEP][0] * ctx / 1e3
    if not leaves:
        return None
    return sum(max(0.0, ev.fits[p][1] + ev.fits[p][0] * ctx / 1e3) for p in leaves)


def whatif(ev: Evidence, ctx: Optional[int], phys: Mapping[str, Any],
            led: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    pts = sorted(solid(ev.points), key=lambda p: p.ctx)
    if not pts:
        return {"available": False, "reason": "no decode steps yet"}
    lo, hi = min(p.ctx_sum for p in pts), max(p.ctx_sum for p in pts)
    out: dict[str, Any] = {"supported_range": [round(lo), round(hi)]}
    if ctx is not None:
        t = _predict_step(ev, ctx)
        near = min(pts, key=lambda p: abs(p.ctx - ctx))
        out["at"] = {"ctx": ctx, "step_ms": t, "al": near.al, "al_from": near.label,
                     "tok_s": 1e3 * near.al / t if t else None, "batch_size": 1,
                     "extrapolation": not lo <= ctx <= hi,
                     "note": ("within the measured range" if lo <= ctx <= hi else
                              f"extrapolation: the data covers {round(lo)}-{round(hi)} tokens per step")}
    if phys.get("available"):
        b = pts[-1]  # the longest context with data
        attn = b.phases.get(_VA)
        if attn:
            roof = phys["roofline_ms_per_1k"] * b.ctx_sum / 1e3
            out["attention_at_roofline"] = {"bucket": b.label, "speedup": b.step_ms / (b.step_ms - attn + roof)}
    out["draft_budget"] = budget_advice(ev, led)
    return out


def budget_advice(ev: Evidence, led: Optional[Mapping[str, Any]] = None) -> list[dict[str, Any]]:
    """F6: position i+1 pays while p_{i+1} / AL_i > (marginal cost of one position) / T_step.
    Measured: p_i per own-context bucket, the step time.  With a plain baseline (the ledger) the
    step with no drafts is the plain step at this context and a position costs (T_step - T_plain) / k,
    both measured, both the ledger's wall steps (host time between steps included).  Without one
    (assumed): a draft position costs the draft phase / k plus verify / (k + 1) of the step, and the
    host time between steps is paid by every budget alike."""
    rows = (led or {}).get("rows") or [] if (led or {}).get("available") else []
    pts = solid(ev.points)
    by_label = {p.label: p for p in pts}
    out = []
    for label, v in solid_acceptance(ev):
        pt = by_label.get(label) or (min(pts, key=lambda p: abs(p.ctx - _lo_of(label))) if pts else None)
        if pt is None or not v or not v.get("p"):
            continue
        k = len(v["p"])
        lr = (next((r for r in rows if r["label"] == pt.label), None)
              or min(rows, key=lambda r: abs(r["ctx"] - pt.ctx))) if rows else None
        if lr is not None:  # measured: the plain step at this context, and the step's excess over it
            base = lr["plain_step_ms"]
            per_pos = max(0.0, lr["step_ms"] - base) / k
        else:
            per_pos = pt.phases.get(Phase.DRAFT.value, 0.0) / k + pt.phases.get(_V, 0.0) / (k + 1)
            base = pt.step_ms + pt.phases.get(HOST_GAP, 0.0) - k * per_pos  # a step with no drafts (assumed)
        best_k, best = 0, 1e3 / base if base > 0 else 0.0
        al = 1.0
        rates = {0: best}
        for i in range(1, k + 1):
            al += v["p"][i - 1]
            rate = 1e3 * al / (base + i * per_pos) if base + i * per_pos > 0 else 0.0
            rates[i] = rate
            if rate > best:
                best_k, best = i, rate
        line = (f"{label}: best draft budget {best_k} of {k} measured positions (predicted {best:.1f} tok/s "
                f"vs {rates[k]:.1f} at {k})")
        if best_k == 0:
            line = f"{label}: turn speculation off above context {_lo_of(label)}: no budget beats plain decode"
        if lr is not None:
            out.append({"bucket": label, "best_budget": best_k, "rates": rates, "advice": line,
                        "measured": "p_i per position, step times, and the plain step at this context "
                                    f"({lr['plain_from']})", "assumed":
                        "draft positions cost the same each ((T_step - T_plain) / k)"})
            continue
        out.append({"bucket": label, "best_budget": best_k, "rates": rates, "advice": line,
                    "measured": "p_i per position, step and phase times", "assumed":
                    "each draft position costs draft/k + verify/(k+1) of this bucket's step (one budget "
                    "measured; sweep --draft-tokens measures it, diagnose --plain measures the step without drafts)"})
    return out


def _lo_of(label: str) -> int:
    return int(label.split("-")[0].rstrip("+"))

