"""The noise model of ``compare`` and ``diagnose --baseline``: is B worse than baseline A beyond noise?

Rows are per-context summaries (``cli.sweep_results.summarize``, or a profile's buckets turned into
the same shape by ``views.diagnosis``): ``{"ctx", "phases_ms": {phase: {"min", "second"}},
"accept_per_step": {"median", "spread"}, "decode_tok_s": {"median", "spread"}}``.  B is compared
with what A predicts: A's own value at a context A measured, else A's per-phase least-squares fit
over context (ms per 1k ctx).

Noise-aware.  A phase's ms per step is taken as the best (minimum) of the repeats - on a shared
machine contention only ever adds time - and its noise is the gap between the best two repeats;
acceptance and tok/s use the median and half the min-max range.  A change counts only beyond
``k * max(noise_A, noise_B) + rel * |A| + abs`` (``k``=2, ``rel``=5 %, ``abs``=0.05 ms by default).
Two-point tok/s is shown but only judged when the runs have no phase breakdown (the client-side
figure carries the prefill noise that the server's per-step times do not).

Verdict: **regression** when any quantity got worse beyond noise (exit code 1, for CI); otherwise
**inherent context scaling** when B's tok/s falls with context by more than ``rel`` while every
quantity is within noise of the baseline (the phases whose least-squares slope over context grows
are listed, "-" when none does); otherwise **no significant change**.  When nothing
could be compared at all (no quantity both runs measured, or B's contexts are not A's and A has too
few contexts to fit) the verdict is **nothing comparable**, with why, and exit code 2: zero checks is
no evidence of "no change".
"""

from __future__ import annotations

from typing import Any

from .names import LEAF_PHASES

PHASES = LEAF_PHASES + ("step",)


def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares y = slope * x + intercept; None with fewer than 2 distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def _series(rows: list[dict], q: str) -> dict[int, dict]:
    """ctx -> {"value", "noise"} for one quantity (see the module docstring for the statistics)."""
    out = {}
    for r in rows:
        st = r["phases_ms"].get(q) if q in PHASES else r.get(q)
        if not st:
            continue
        if q in PHASES:
            out[r["ctx"]] = {"value": st["min"], "noise": st.get("second", st["min"]) - st["min"]}
        else:
            out[r["ctx"]] = {"value": st["median"], "noise": st["spread"]}
    return out


def _quantities(rows_a: list[dict], rows_b: list[dict]) -> list[tuple[str, bool, bool, bool]]:
    """(name, higher_is_worse, is_ms, judged) for every quantity both runs have."""
    qs = []
    for p in PHASES:
        if _series(rows_a, p) and _series(rows_b, p):
            qs.append((p, True, True, True))
    has_phases = bool(qs)
    for q in ("accept_per_step", "decode_tok_s"):
        if _series(rows_a, q) and _series(rows_b, q):
            qs.append((q, False, False, q != "decode_tok_s" or not has_phases))
    return qs


def pct_text(delta_pct: float | None) -> str:
    """A change in percent of the baseline, or "from 0" where the baseline was 0 (no percentage)."""
    return "from 0" if delta_pct is None else f"{delta_pct:+.0f}%"


def compare(rows_a: list[dict], rows_b: list[dict], k: float = 2.0, rel: float = 0.05,
            abs_ms: float = 0.05) -> dict[str, Any]:
    checks = []
    for q, higher_worse, is_ms, judged in _quantities(rows_a, rows_b):
        sa, sb = _series(rows_a, q), _series(rows_b, q)
        f = fit([(c / 1000, s["value"]) for c, s in sa.items()])
        noise_a_max = max(s["noise"] for s in sa.values())
        for ctx, b in sorted(sb.items()):
            if ctx in sa:
                a_val, a_noise, source = sa[ctx]["value"], sa[ctx]["noise"], "measured"
            elif f is not None:
                a_val, a_noise, source = f[0] * ctx / 1000 + f[1], noise_a_max, "A fit"
            else:
                continue
            noise = k * max(a_noise, b["noise"]) + rel * abs(a_val) + (abs_ms if is_ms else 0.0)
            delta = b["value"] - a_val
            worse = delta > noise if higher_worse else -delta > noise
            better = -delta > noise if higher_worse else delta > noise
            status = "worse" if worse else "better" if better else "same"
            checks.append({"ctx": ctx, "quantity": q, "a": a_val, "b": b["value"], "delta": delta,
                           "delta_pct": 100 * delta / a_val if a_val else None, "noise": noise,
                           "source": source, "status": status if judged else f"({status})"})
    regressions = [c for c in checks if c["status"] == "worse"]
    scaling = _scaling(rows_b)
    if not checks:
        return {"verdict": "nothing comparable", "why": _nothing_why(rows_a, rows_b), "checks": [],
                "scaling": scaling, "exit_code": 2}
    if regressions:
        top = sorted(regressions, key=lambda c: -abs(c["delta_pct"] or 0))[:3]
        verdict = "regression"
        why = "; ".join(f"{c['quantity']} at ctx {c['ctx']}: {c['a']:.3g} -> {c['b']:.3g} "
                        f"({pct_text(c['delta_pct'])}, noise ±{c['noise']:.2g})" for c in top)
    elif scaling and scaling["drop_pct"] > 100 * rel:
        verdict = "inherent context scaling"
        grow = ", ".join(f"{p} {s:+.3f} ms/1k ctx" for p, s in scaling["slopes"].items() if s > 0) or "-"
        why = (f"tok/s falls {scaling['drop_pct']:.0f}% from ctx {scaling['ctx_lo']} to {scaling['ctx_hi']}, "
               f"every phase within the baseline's noise; growing phases: {grow}")
    else:
        verdict = "no significant change"
        why = "every phase and the acceptance within noise of the baseline"
    return {"verdict": verdict, "why": why, "checks": checks, "scaling": scaling,
            "exit_code": 1 if regressions else 0}


def _nothing_why(rows_a: list[dict], rows_b: list[dict]) -> str:
    """Why a comparison made no check: an empty run, no shared quantity, or no shared context."""
    qs = PHASES + ("accept_per_step", "decode_tok_s")
    has = {run: [q for q in qs if _series(rows, q)] for run, rows in (("A", rows_a), ("B", rows_b))}
    for run, rows in (("A", rows_a), ("B", rows_b)):
        if not has[run]:
            return f"run {run} measured nothing ({len(rows)} context(s), none with a value)"
    if not set(has["A"]) & set(has["B"]):
        return (f"the runs share no measured quantity (A: {', '.join(has['A'])}; B: {', '.join(has['B'])}); "
                f"was one of them run without the profiler?")
    ctx_a = sorted({r["ctx"] for r in rows_a})
    ctx_b = sorted({r["ctx"] for r in rows_b})
    return (f"B's contexts ({', '.join(map(str, ctx_b))}) are not among A's ({', '.join(map(str, ctx_a))}), "
            f"and A has too few contexts to fit its scaling over context (2 needed)")


def _scaling(rows: list[dict]) -> dict[str, Any] | None:
    tp = [(r["ctx"], r["decode_tok_s"]["median"]) for r in rows if r["decode_tok_s"]]
    if len(tp) < 2:
        return None
    (c0, v0), (c1, v1) = tp[0], tp[-1]
    slopes = {}
    for p in PHASES:
        f = fit([(c / 1000, s["value"]) for c, s in _series(rows, p).items()])
        if f is not None and p != "step":
            slopes[p] = f[0]
    return {"ctx_lo": c0, "ctx_hi": c1, "tok_s_lo": v0, "tok_s_hi": v1,
            "drop_pct": 100 * (v0 - v1) / v0 if v0 else 0.0, "slopes": slopes}
