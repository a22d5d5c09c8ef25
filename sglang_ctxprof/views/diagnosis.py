"""The verdict: "regression or inherent?", what to change, and the evidence, from a typed profile.

The evidence (``diagnosis_evidence``: :func:`evidence_from_profile` of a ``/ctx_profile``
profile, :func:`evidence_from_sweep` of a saved sweep; robust per-bucket means, outlier steps set
apart) goes into :func:`diagnose`, which gives:

* ``headline``: one sentence first;
* ``decomposition`` of the drop between the lowest and the highest context with data:
  log(tok/s2 / tok/s1) = log(AL2/AL1) - log(T2/T1), and the step-time change per leaf phase;
* ``phases``: slope (ms per 1k ctx), intercept, r2, n and fit method per phase;
* ``physics``: verify attention's slope against the HBM roofline slope (GPU only; on the CPU it is
  unavailable and says so);
* ``baseline``: every phase, acceptance and tok/s against a baseline through the noise model of
  ``compare`` (``model.noise``); any phase worse beyond noise is "regression in <phase>"; when no
  check could be made, ``comparable`` is False and the verdict says "nothing comparable" and why;
* ``flags`` (``diagnosis_flags``): downgrades, acceptance falling with context, host bubbles,
  outlier steps, lost records;
* ``ledger`` (``aggregate.ledger``): is speculation paying, against a plain-decode arm where one is
  given, or the reason it is unavailable;
* ``whatif`` (``diagnosis_whatif``): predicted tok/s at a context and the draft-budget advice.

Pure: imports nothing of SGLang, torch or OTel.  ``diagnosis_text.render_text`` prints it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from ..model.names import TIMING_CPU, TIMING_CPU_MODES, Phase
from ..model.noise import compare, pct_text
from ..aggregate.acceptance import describe_exec
from ..aggregate.ledger import ledger
from .diagnosis_evidence import (HOST_GAP, MIN_POINT_STEPS, Evidence, Point,  # noqa: F401 - re-exported
                                 evidence_from_profile, evidence_from_sweep, leaves, ledger_points, left_out,
                                 solid)
from .diagnosis_flags import ACCEPT_TOL, BUBBLE_SHARE, flags as _flags  # noqa: F401 - re-exported
from .diagnosis_whatif import whatif

ROOFLINE_FACTOR = 3.0  # measured attention slope within this factor of the roofline: "inherent"
SHARE_MIN_PCT = 5.0  # tok/s changing less than this between the ends: no shares of the change
_SHARE_MIN = -math.log(1 - SHARE_MIN_PCT / 100)
PAIR_CTX = 0.05  # a bucket's mean context this close (relative) to the baseline's: compared as measured
_STEP, _VA, _V = Phase.STEP.value, Phase.VERIFY_ATTN.value, Phase.VERIFY.value
NOT_LEAVES = (_STEP, "accept_per_step", "decode_tok_s")  # the compared quantities that are no leaf phase


# ---- parts of the verdict -------------------------------------------------------------------------
def _decomposition(ev: Evidence) -> Optional[dict[str, Any]]:
    """Between the lowest and the highest context of the :func:`solid` points (None with fewer than
    two); ``left_out`` names the thin points it left out (none when every point is thin)."""
    pts = sorted(solid(ev.points), key=lambda p: p.ctx)
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    acc_term = math.log(b.al / a.al)
    time_term = -math.log(b.step_ms / a.step_ms)
    total = acc_term + time_term
    la, lb = leaves(a.phases), leaves(b.phases)
    dt = b.step_ms - a.step_ms
    shared = abs(dt) >= SHARE_MIN_PCT / 100 * a.step_ms  # a smaller change has no shares (they'd read 1000s of %)
    per_phase = {p: {"lo_ms": la.get(p, 0.0), "hi_ms": lb.get(p, 0.0), "delta_ms": lb.get(p, 0.0) - la.get(p, 0.0),
                     "share_of_step_growth": (lb.get(p, 0.0) - la.get(p, 0.0)) / dt if shared else None}
                 for p in sorted(set(la) | set(lb))}
    return {"lo": {"label": a.label, "ctx": a.ctx, "tok_s": a.tok_s, "al": a.al, "step_ms": a.step_ms},
            "hi": {"label": b.label, "ctx": b.ctx, "tok_s": b.tok_s, "al": b.al, "step_ms": b.step_ms},
            "log_tok_s_ratio": total, "log_al_ratio": acc_term, "minus_log_step_ratio": time_term,
            "drop_pct": 100 * (1 - b.tok_s / a.tok_s) if a.tok_s else 0.0,
            # shares of a change too small to share out (tok/s within SHARE_MIN_PCT) would read thousands of %
            "acceptance_share": acc_term / total if abs(total) >= _SHARE_MIN else None,
            "step_time_share": time_term / total if abs(total) >= _SHARE_MIN else None,
            "step_delta_ms": dt, "phases": per_phase, "left_out": [p.label for p in left_out(ev.points)],
            "thin": a.thin}


def _phases(ev: Evidence) -> dict[str, Any]:
    return {p: {"ms_per_1k_ctx": f[0], "intercept_ms": f[1], "r2": f[2], "n": f[3], "method": f[4]}
            for p, f in ev.fits.items()}


def _physics(ev: Evidence) -> dict[str, Any]:
    hw = ev.hw or {}
    if (ev.timing or TIMING_CPU) in TIMING_CPU_MODES:
        return {"available": False, "reason": "CPU run: there is no HBM roofline to hold the attention "
                                              "slope against; the verdict rests on the slopes and the baseline"}
    gbps, per_tok = hw.get("hbm_gbps"), hw.get("kv_bytes_per_token")
    if not gbps or not per_tok:
        return {"available": False, "reason": hw.get("source") or "device bandwidth or KV layout unknown"}
    f = ev.fits.get(_VA)
    if f is None or f[0] <= 0:
        return {"available": False, "reason": "no positive verify-attention slope measured"}
    roof = per_tok * 1e3 / (gbps * 1e9) * 1e3  # ms per 1k tokens of context per step
    ratio = f[0] / roof
    if ratio <= ROOFLINE_FACTOR:
        verdict = f"inherent: attention over a long KV cache, at {100 / ratio:.0f}% of the HBM roofline"
    else:
        verdict = (f"attention is {ratio:.0f}x slower than the memory system allows: a kernel or "
                   f"configuration problem, not physics")
    return {"available": True, "measured_ms_per_1k": f[0], "roofline_ms_per_1k": roof, "ratio": ratio,
            "factor": ROOFLINE_FACTOR, "verdict": verdict, "hbm_gbps": gbps, "kv_bytes_per_token": per_tok}


def _rows(ev: Evidence, paired: Optional[Evidence] = None) -> list[dict[str, Any]]:
    """The evidence in the row shape of the compare noise model.  With ``paired`` (the baseline), a
    point of the same bucket label whose mean context is within :data:`PAIR_CTX` of the baseline's
    takes the baseline's context, so the two are compared as measured: two runs of one workload fill
    a bucket to means a few tokens apart, which the noise model would otherwise read off A's line."""
    near = {p.label: p.ctx for p in solid(paired.points)} if paired is not None else {}
    out = []
    for p in solid(ev.points):
        ph = {q: {"min": v, "second": v + p.noise.get(q, 0.0)} for q, v in leaves(p.phases).items()}
        ph[_STEP] = {"min": p.step_ms, "second": p.step_ms + p.noise.get(_STEP, 0.0)}
        ctx = near.get(p.label, p.ctx)
        out.append({"ctx": round(ctx if abs(ctx - p.ctx) <= PAIR_CTX * ctx else p.ctx), "phases_ms": ph,
                    "accept_per_step": {"median": p.al, "spread": 0.0},
                    "decode_tok_s": {"median": p.tok_s, "spread": 0.0}})
    return out


def _baseline(ev: Evidence, base: Optional[Evidence], k: float, rel: float, abs_ms: float) -> dict[str, Any]:
    if base is None:
        return {"given": False, "verdict": "no baseline given"}
    out = compare(_rows(base), _rows(ev, base), k, rel, abs_ms)
    slopes = {p: {"baseline": base.fits[p][0], "now": ev.fits[p][0]} for p in ev.fits if p in base.fits}
    if not out["checks"]:
        return {"given": True, "source": base.source, "comparable": False, "regressions": [], "slopes": slopes,
                "checks": [], "verdict": f"nothing comparable with the baseline: {out['why']}"}
    worse: dict[str, list] = {}
    for c in out["checks"]:
        if c["status"] == "worse":
            worse.setdefault(c["quantity"], []).append(c)
    regressions = []
    for q, cs in sorted(worse.items(), key=lambda kv: -max(abs(c["delta"]) for c in kv[1])):
        if q == _STEP and any(x not in NOT_LEAVES for x in worse):
            continue  # the step is the sum of its leaves: name the leaf
        top = max(cs, key=lambda c: abs(c["delta"]))
        s = slopes.get(q)
        regressions.append({"phase": q, "ctx": top["ctx"], "baseline": top["a"], "now": top["b"],
                            "delta_pct": top["delta_pct"], "noise": top["noise"],
                            "slope_baseline": s["baseline"] if s else None, "slope_now": s["now"] if s else None})
    if regressions:
        verdict = "; ".join(_regression_line(r) for r in regressions[:3])
    else:
        verdict = "no phase changed beyond noise against the baseline"
    return {"given": True, "source": base.source, "comparable": True, "verdict": verdict,
            "regressions": regressions, "slopes": slopes, "checks": out["checks"]}


def _regression_line(r: Mapping[str, Any]) -> str:
    what = "acceptance" if r["phase"] == "accept_per_step" else r["phase"]
    line = (f"regression in {what}: {r['baseline']:.3g} -> {r['now']:.3g} at ctx {r['ctx']} "
            f"({pct_text(r['delta_pct'])}, noise ±{r['noise']:.2g})")
    if r.get("slope_baseline") is not None:
        line += f", slope {r['slope_baseline']:+.3f} -> {r['slope_now']:+.3f} ms/1k"
    return line


def diagnose(ev: Evidence, baseline: Optional[Evidence] = None, ctx: Optional[int] = None,
             k: float = 2.0, rel: float = 0.05, abs_ms: float = 0.05,
             plain: Optional[Evidence] = None) -> dict[str, Any]:
    """``plain``: a plain-decode profile or sweep of the same model (the speculation ledger)."""
    dec = _decomposition(ev)
    phys = _physics(ev)
    base = _baseline(ev, baseline, k, rel, abs_ms)
    flags = _flags(ev, dec)
    led = ledger(ledger_points(ev), ledger_points(plain) if plain is not None else [])
    if plain is not None:
        led["plain_source"] = plain.source
    head = _headline(ev, dec, phys, base, flags)
    if led.get("available"):
        head += "; " + led["verdict"]
    out = {"source": ev.source, "headline": head, "flags": flags, "ledger": led,
           "decomposition": dec, "phases": _phases(ev), "physics": phys, "baseline": base,
           "exec_mode": {lbl: x for lbl, x in ev.exec_modes},
           "acceptance_by_ctx": {lbl: v for lbl, v in ev.acceptance},
           "host": dict(ev.host), "whatif": whatif(ev, ctx, phys, led),
           "outliers": {lbl: r for lbl, r in ev.outliers},
           "fit_method": sorted({f[4] for f in ev.fits.values()})}
    return out


def _thin(ev: Evidence) -> list[str]:
    """The thin points the verdict left out (``left_out``), said in one part of the headline."""
    left = left_out(ev.points)
    if not left:
        return []
    return [", ".join(f"{p.label}: {p.steps} step{'s' if p.steps != 1 else ''}" for p in left)
            + f", too few to compare (under {MIN_POINT_STEPS})"]


def _headline(ev: Evidence, dec: Optional[dict], phys: Mapping, base: Mapping, flags: list) -> str:
    if dec is None:
        if not ev.points:
            return "no decode steps recorded yet"
        return "; ".join([f"one context bucket with enough steps ({solid(ev.points)[0].label}): nothing to "
                          "compare across context yet"] + _thin(ev))
    lo, hi = dec["lo"], dec["hi"]
    parts = []
    drop = dec["drop_pct"]
    how = (f"{drop:.0f}% slower than" if drop >= 0.5 else f"{-drop:.0f}% faster than" if drop <= -0.5
           else "about as fast as")
    parts.append(f"at {hi['ctx']:.0f} context decode is {how} at {lo['ctx']:.0f} "
                 f"({hi['tok_s']:.1f} vs {lo['tok_s']:.1f} tok/s)")
    ratio = hi["al"] / lo["al"]
    if abs(ratio - 1) < ACCEPT_TOL:
        parts.append("acceptance is unchanged")
    elif dec["acceptance_share"] is None:
        step = "grows" if hi["step_ms"] > lo["step_ms"] else "shrinks"
        parts.append(f"acceptance {'falls' if ratio < 1 else 'rises'} {lo['al']:.2f} -> {hi['al']:.2f} and the "
                     f"step time {step} with it ({lo['step_ms']:.1f} -> {hi['step_ms']:.1f} ms): they about cancel")
    elif dec["acceptance_share"] >= 0:
        parts.append(f"acceptance {'falls' if ratio < 1 else 'rises'} {lo['al']:.2f} -> {hi['al']:.2f} "
                     f"and explains {100 * dec['acceptance_share']:.0f}% of the change")
    else:
        parts.append(f"acceptance {'falls' if ratio < 1 else 'rises'} {lo['al']:.2f} -> {hi['al']:.2f} "
                     f"(it offsets {100 * -dec['acceptance_share']:.0f}% of the change)")
    grow = [(p, d) for p, d in dec["phases"].items() if d["delta_ms"] > 0 and d["share_of_step_growth"] is not None]
    if any(d["share_of_step_growth"] is None for d in dec["phases"].values()):  # too small a change to share
        up = max(dec["phases"].items(), key=lambda kv: kv[1]["delta_ms"], default=None)
        how = ("its phases trade off" if any(d["delta_ms"] < 0 for d in dec["phases"].values()) else
               f"{up[0]} {up[1]['delta_ms']:+.2f} ms" if up and up[1]["delta_ms"] > 0 else "no phase moves")
        parts.append(f"the step time barely changes ({lo['step_ms']:.1f} -> {hi['step_ms']:.1f} ms): {how}")
    elif grow and dec["step_delta_ms"] > 0:
        p, d = max(grow, key=lambda kv: kv[1]["delta_ms"])
        f = ev.fits.get(p)
        slope = f" grows {f[0]:+.2f} ms per 1k (r² {f[2]:.2f}) and" if f else ""
        parts.append(f"{p}{slope} explains {100 * d['share_of_step_growth']:.0f}% of the step-time growth "
                     f"({lo['step_ms']:.1f} -> {hi['step_ms']:.1f} ms)")
    downs = [f for f in flags if f["kind"] == "downgrade"]
    modes = sorted({describe_exec(x) for _, x in ev.exec_modes})
    parts.append(downs[0]["message"] if downs else
                 f"no downgrade ({', '.join(modes)})" if modes else "execution mode unknown")
    if phys.get("available"):
        parts.append(phys["verdict"])
    parts += _thin(ev)
    if dec["thin"]:
        parts.append(f"every bucket has fewer than {MIN_POINT_STEPS} steps so far: early figures")
    if ev.outliers:
        n = sum(len(r["outliers"]) for _, r in ev.outliers)
        warm = all(o["warmup"] for _, r in ev.outliers for o in r["outliers"])
        parts.append(f"{n} slow step{'s' if n != 1 else ''} set apart from the means above "
                     f"(in {', '.join(lbl for lbl, _ in ev.outliers)}{'; warm-up?' if warm else ''})")
    parts.append(base["verdict"] if base.get("given") else "no baseline given")
    return "; ".join(parts)
