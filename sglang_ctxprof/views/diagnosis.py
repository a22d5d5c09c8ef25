"""The verdict: "regression or inherent?", what to change, and the evidence, from a typed profile.

:func:`evidence_from_profile` (a ``/ctx_profile`` :class:`~.profile.Profile`) or
:func:`evidence_from_sweep` (a saved sweep's per-context rows) gives an :class:`Evidence`: one
:class:`Point` per context (acceptance length, step time, leaf phases), the per-phase context fits
(ms per 1k tokens of context; the robust Theil-Sen fit where the profile has one), execution modes,
acceptance by position, host time and the loss counters.  :func:`diagnose` turns it into:

* ``headline``: one sentence first;
* ``decomposition`` of the drop between the lowest and the highest context with data:
  log(tok/s2 / tok/s1) = log(AL2/AL1) - log(T2/T1), and the step-time change per leaf phase;
* ``phases``: slope (ms per 1k ctx), intercept, r2, n and fit method per phase;
* ``physics``: verify attention's slope against the HBM roofline slope (GPU only; on the CPU it is
  unavailable and says so);
* ``baseline``: every phase, acceptance and tok/s against a baseline through the noise model of
  ``compare`` (``model.noise``); any phase worse beyond noise is "regression in <phase>";
* ``flags``: execution-mode downgrades, acceptance falling with context, host bubbles above
  :data:`BUBBLE_SHARE`, steps set apart as outliers (``aggregate.outliers``: how many, where, how
  much, "warm-up?"), dropped or evicted records;

Every per-bucket number of a profile is its **robust** mean: the mean over the bucket's steps
without those slower than ``OUTLIER_FACTOR`` x its median step, which are reported apart.  A few
warm-up steps therefore cannot flip the headline.
* ``whatif``: predicted tok/s at a context from the fits and the nearest bucket's acceptance (with
  the range the data supports), the speedup if verify attention ran at the roofline, and the
  draft-budget advice per bucket (measured vs assumed stated).

Pure: imports nothing of SGLang, torch or OTel.  ``render_text`` prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..model.names import LEAF_PHASES, Phase
from ..model.noise import compare, fit
from ..model.stats import theil_sen
from ..aggregate.acceptance import describe_exec
from ..aggregate.ledger import ledger
from ..aggregate.outliers import describe as describe_outliers
from .audit_view import audit_counts, audit_flags

BUBBLE_SHARE = 0.10  # host time between/inside steps above this share of the wall time is flagged
ROOFLINE_FACTOR = 3.0  # measured attention slope within this factor of the roofline: "inherent"
ACCEPT_TOL = 0.05  # relative acceptance change below this reads "unchanged"
_STEP, _VA, _V = Phase.STEP.value, Phase.VERIFY_ATTN.value, Phase.VERIFY.value
_DEC = Phase.DECODE.value
HOST_GAP = "host_gap"  # a point's typical host time between steps (ms), beside its phases


@dataclass(frozen=True)
class Point:
    label: str
    ctx: float  # mean context per request
    ctx_sum: float  # mean summed context per step (the fits' x, in tokens)
    steps: int
    al: float  # accepted tokens per request-step (bonus included)
    step_ms: float
    phases: Mapping[str, float]
    noise: Mapping[str, float] = field(default_factory=dict)
    batch: float = 1.0

    @property
    def tok_s(self) -> float:
        return 1e3 * self.al / self.step_ms if self.step_ms > 0 else 0.0


@dataclass(frozen=True)
class Evidence:
    source: str
    points: tuple[Point, ...]
    fits: Mapping[str, tuple[float, float, float, int, str]]  # slope, intercept, r2, n, method
    timing: Optional[str] = None
    hw: Optional[Mapping[str, Any]] = None
    exec_modes: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    acceptance: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    host: Mapping[str, Any] = field(default_factory=dict)
    dropped: int = 0
    evicted: int = 0
    draft_budget: Optional[int] = None
    # Buckets with steps set apart as outliers: (label, ``aggregate.outliers.robust`` dict).
    outliers: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    audit: Mapping[str, int] = field(default_factory=dict)  # the ranks' self-audit: invariant -> violations


def _leaves(phases: Mapping[str, float]) -> dict[str, float]:
    out = {p: float(phases[p]) for p in LEAF_PHASES if p in phases}
    if _V in phases and _VA not in phases:
        out[_V] = float(phases[_V])
    return out


def evidence_from_profile(profile: Any, source: str = "profile") -> Evidence:
    pts = []
    for b in profile.buckets:
        step = b.robust_ms(_STEP)
        if not b.steps or not step:
            continue
        ph = {p: b.robust_ms(p) or 0.0 for p in b.phases}
        noise = {p: 2 * max(0.0, v.p90_ms - v.p50_ms) / math.sqrt(max(1, v.count)) for p, v in b.phases.items()}
        pts.append(Point(b.label, b.mean_ctx, b.ctx_sum / b.steps, b.steps, b.accepted_per_step, step, ph,
                         noise, b.mean_batch_size))
    gap = ((profile.host or {}).get("between_steps") or {})
    if gap.get("count"):  # the typical host time between steps (median: idle gaps between requests)
        pts = [Point(p.label, p.ctx, p.ctx_sum, p.steps, p.al, p.step_ms, {**p.phases, HOST_GAP: gap["p50_ms"]},
                     p.noise, p.batch) for p in pts]
    fits = {p: f.best() for p, f in profile.fits.items()}
    budgets = [b.draft_tokens_per_step for b in profile.buckets if b.draft_tokens]
    return Evidence(source, tuple(pts), fits, profile.timing, profile.hw,
                    tuple((b.label, b.exec_mode) for b in profile.buckets if b.exec_mode),
                    tuple((a["label"], a["acceptance_by_position"]) for a in profile.acceptance_by_ctx),
                    dict(profile.host), int(profile.dropped or 0), int(profile.totals.requests_evicted),
                    round(max(budgets)) - 1 if budgets else None,
                    tuple((b.label, b.robust) for b in profile.buckets if b.robust and b.robust.get("outliers")),
                    audit_counts(profile.ranks))


def evidence_from_sweep(rows: list[Mapping[str, Any]], meta: Mapping[str, Any], source: str = "sweep") -> Evidence:
    """A saved sweep: one point per context (medians over repeats; noise = half the range)."""
    pts = []
    for r in rows:
        ph = {p: st["median"] for p, st in (r.get("phases_ms") or {}).items()}
        al = (r.get("server_accept_per_step") or r.get("accept_per_step") or {}).get("median")
        if ph.get(_STEP) and not al and _DEC in ph:
            al = 1.0  # a plain-decode arm: one token per step
        if not ph.get(_STEP) or not al:
            continue
        noise = {p: st.get("spread", 0.0) for p, st in r["phases_ms"].items()}
        pts.append(Point(str(r["ctx"]), float(r["ctx"]), float(r["ctx"]), int(r.get("repeats", 1)), float(al),
                         float(ph[_STEP]), ph, noise))
    fits = {}
    for p in LEAF_PHASES + (_STEP, _V):
        xy = [(pt.ctx_sum / 1e3, pt.phases[p]) for pt in pts if p in pt.phases]
        ts = theil_sen(xy) if len(xy) >= 2 else None
        if ts is not None:
            fits[p] = (ts["slope"], ts["intercept"], ts["r2"], int(ts["n"]), "theil-sen over contexts")
    return Evidence(source, tuple(pts), fits, meta.get("timing"), meta.get("hw"))


# ---- parts of the verdict -------------------------------------------------------------------------
def _decomposition(ev: Evidence) -> Optional[dict[str, Any]]:
    pts = sorted(ev.points, key=lambda p: p.ctx)
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    acc_term = math.log(b.al / a.al)
    time_term = -math.log(b.step_ms / a.step_ms)
    total = acc_term + time_term
    la, lb = _leaves(a.phases), _leaves(b.phases)
    dt = b.step_ms - a.step_ms
    per_phase = {p: {"lo_ms": la.get(p, 0.0), "hi_ms": lb.get(p, 0.0), "delta_ms": lb.get(p, 0.0) - la.get(p, 0.0),
                     "share_of_step_growth": (lb.get(p, 0.0) - la.get(p, 0.0)) / dt if dt else 0.0}
                 for p in sorted(set(la) | set(lb))}
    return {"lo": {"label": a.label, "ctx": a.ctx, "tok_s": a.tok_s, "al": a.al, "step_ms": a.step_ms},
            "hi": {"label": b.label, "ctx": b.ctx, "tok_s": b.tok_s, "al": b.al, "step_ms": b.step_ms},
            "log_tok_s_ratio": total, "log_al_ratio": acc_term, "minus_log_step_ratio": time_term,
            "drop_pct": 100 * (1 - b.tok_s / a.tok_s) if a.tok_s else 0.0,
            "acceptance_share": acc_term / total if total else 0.0,
            "step_time_share": time_term / total if total else 0.0,
            "step_delta_ms": dt, "phases": per_phase}


def _phases(ev: Evidence) -> dict[str, Any]:
    return {p: {"ms_per_1k_ctx": f[0], "intercept_ms": f[1], "r2": f[2], "n": f[3], "method": f[4]}
            for p, f in ev.fits.items()}


def _physics(ev: Evidence) -> dict[str, Any]:
    hw = ev.hw or {}
    if (ev.timing or "cpu") == "cpu":
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


def _rows(ev: Evidence) -> list[dict[str, Any]]:
    """The evidence in the row shape of the compare noise model."""
    out = []
    for p in ev.points:
        ph = {q: {"min": v, "second": v + p.noise.get(q, 0.0)} for q, v in _leaves(p.phases).items()}
        ph[_STEP] = {"min": p.step_ms, "second": p.step_ms + p.noise.get(_STEP, 0.0)}
        out.append({"ctx": round(p.ctx), "phases_ms": ph, "accept_per_step": {"median": p.al, "spread": 0.0},
                    "decode_tok_s": {"median": p.tok_s, "spread": 0.0}})
    return out


def _baseline(ev: Evidence, base: Optional[Evidence], k: float, rel: float, abs_ms: float) -> dict[str, Any]:
    if base is None:
        return {"given": False, "verdict": "no baseline given"}
    out = compare(_rows(base), _rows(ev), k, rel, abs_ms)
    worse: dict[str, list] = {}
    for c in out["checks"]:
        if c["status"] == "worse":
            worse.setdefault(c["quantity"], []).append(c)
    slopes = {p: {"baseline": base.fits[p][0], "now": ev.fits[p][0]} for p in ev.fits if p in base.fits}
    regressions = []
    for q, cs in sorted(worse.items(), key=lambda kv: -max(abs(c["delta"]) for c in kv[1])):
        if q == _STEP and len(worse) > 1:
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
    return {"given": True, "source": base.source, "verdict": verdict, "regressions": regressions,
            "slopes": slopes, "checks": out["checks"]}


def _regression_line(r: Mapping[str, Any]) -> str:
    what = "acceptance" if r["phase"] == "accept_per_step" else r["phase"]
    line = (f"regression in {what}: {r['baseline']:.3g} -> {r['now']:.3g} at ctx {r['ctx']} "
            f"({r['delta_pct']:+.0f}%, noise ±{r['noise']:.2g})")
    if r.get("slope_baseline") is not None:
        line += f", slope {r['slope_baseline']:+.3f} -> {r['slope_now']:+.3f} ms/1k"
    return line


def _flags(ev: Evidence, dec: Optional[dict]) -> list[dict[str, str]]:
    flags = []
    for label, x in ev.exec_modes:
        if x.get("downgrade"):
            flags.append({"kind": "downgrade", "message": f"bucket {label}: {describe_exec(x)}"})
    acc = [(lbl, v) for lbl, v in ev.acceptance if v and v.get("n_steps", 0) >= 5]
    if len(acc) >= 2 and acc[-1][1]["mean_len"] < acc[0][1]["mean_len"] * (1 - ACCEPT_TOL):
        flags.append({"kind": "acceptance_falls", "message":
                      f"acceptance length falls with context: {acc[0][1]['mean_len']:.2f} at {acc[0][0]} -> "
                      f"{acc[-1][1]['mean_len']:.2f} at {acc[-1][0]} (own-context buckets)"})
    gaps = (ev.host.get("between_steps") or {}).get("total_ms", 0.0)
    inside = (ev.host.get("in_step") or {}).get("total_ms", 0.0)
    steps_ms = sum(p.step_ms * p.steps for p in ev.points)
    if steps_ms > 0 and (gaps + inside) / (gaps + inside + steps_ms) > BUBBLE_SHARE:
        share = (gaps + inside) / (gaps + inside + steps_ms)
        flags.append({"kind": "host_bubbles", "message":
                      f"host time outside the model calls is {100 * share:.0f}% of the scheduler's wall time "
                      f"({gaps:.0f} ms between steps, {inside:.0f} ms inside run_batch; threshold "
                      f"{100 * BUBBLE_SHARE:.0f}%)"})
    for label, r in ev.outliers:
        flags.append({"kind": "outlier_steps", "message": describe_outliers(label, r)})
    if ev.dropped or ev.evicted:
        flags.append({"kind": "lost_records", "message": f"{ev.dropped} step records dropped, "
                                                         f"{ev.evicted} requests evicted from the history"})
    return flags + audit_flags(ev.audit)


def _predict_step(ev: Evidence, ctx: float) -> Optional[float]:
    leaves = [p for p in LEAF_PHASES if p in ev.fits] or ([_V] if _V in ev.fits else [])
    if _STEP in ev.fits and not leaves:
        return ev.fits[_STEP][1] + ev.fits[_STEP][0] * ctx / 1e3
    if not leaves:
        return None
    return sum(max(0.0, ev.fits[p][1] + ev.fits[p][0] * ctx / 1e3) for p in leaves)


def _whatif(ev: Evidence, ctx: Optional[int], phys: Mapping[str, Any],
            led: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    pts = sorted(ev.points, key=lambda p: p.ctx)
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
        b = pts[-1]
        attn = b.phases.get(_VA)
        if attn:
            roof = phys["roofline_ms_per_1k"] * b.ctx_sum / 1e3
            out["attention_at_roofline"] = {"bucket": b.label, "speedup": b.step_ms / (b.step_ms - attn + roof)}
    out["draft_budget"] = _budget_advice(ev, led)
    return out


def _budget_advice(ev: Evidence, led: Optional[Mapping[str, Any]] = None) -> list[dict[str, Any]]:
    """F6: position i+1 pays while p_{i+1} / AL_i > (marginal cost of one position) / T_step.
    Measured: p_i per own-context bucket, the step time.  With a plain baseline (the ledger) the
    step with no drafts is the plain step at this context and a position costs (T_step - T_plain) / k,
    both measured.  Without one (assumed): a draft position costs the draft phase / k plus
    verify / (k + 1) of the step."""
    rows = (led or {}).get("rows") or [] if (led or {}).get("available") else []
    by_label = {p.label: p for p in ev.points}
    out = []
    for label, v in ev.acceptance:
        pt = by_label.get(label) or (min(ev.points, key=lambda p: abs(p.ctx - _lo_of(label))) if ev.points else None)
        if pt is None or not v or not v.get("p"):
            continue
        k = len(v["p"])
        lr = min(rows, key=lambda r: abs(r["ctx"] - pt.ctx)) if rows else None
        if lr is not None:  # measured: the plain step at this context, and the step's excess over it
            base = lr["plain_step_ms"]
            per_pos = max(0.0, pt.step_ms - base) / k
        else:
            per_pos = pt.phases.get(Phase.DRAFT.value, 0.0) / k + pt.phases.get(_V, 0.0) / (k + 1)
            base = pt.step_ms - k * per_pos  # a step with no drafts (assumed)
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


def ledger_points(ev: Evidence) -> list[dict[str, Any]]:
    """The evidence's points in the shape of ``aggregate.ledger``."""
    return [{"ctx": p.ctx, "label": p.label, "al": p.al, "phases": {**p.phases, _STEP: p.step_ms}}
            for p in ev.points]


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
           "host": dict(ev.host), "whatif": _whatif(ev, ctx, phys, led),
           "outliers": {lbl: r for lbl, r in ev.outliers},
           "fit_method": sorted({f[4] for f in ev.fits.values()})}
    return out


def _headline(ev: Evidence, dec: Optional[dict], phys: Mapping, base: Mapping, flags: list) -> str:
    if dec is None:
        return (f"one context bucket with data ({ev.points[0].label}): nothing to compare across context yet"
                if ev.points else "no decode steps recorded yet")
    lo, hi = dec["lo"], dec["hi"]
    parts = []
    if dec["drop_pct"] > 0:
        parts.append(f"at {hi['ctx']:.0f} context decode is {dec['drop_pct']:.0f}% slower than at {lo['ctx']:.0f} "
                     f"({hi['tok_s']:.1f} vs {lo['tok_s']:.1f} tok/s)")
    else:
        parts.append(f"at {hi['ctx']:.0f} context decode is not slower than at {lo['ctx']:.0f} "
                     f"({hi['tok_s']:.1f} vs {lo['tok_s']:.1f} tok/s)")
    ratio = hi["al"] / lo["al"]
    if abs(ratio - 1) < ACCEPT_TOL:
        parts.append("acceptance is unchanged")
    elif dec["acceptance_share"] >= 0:
        parts.append(f"acceptance {'falls' if ratio < 1 else 'rises'} {lo['al']:.2f} -> {hi['al']:.2f} "
                     f"and explains {100 * dec['acceptance_share']:.0f}% of the change")
    else:
        parts.append(f"acceptance {'falls' if ratio < 1 else 'rises'} {lo['al']:.2f} -> {hi['al']:.2f} "
                     f"(it offsets {100 * -dec['acceptance_share']:.0f}% of the change)")
    grow = [(p, d) for p, d in dec["phases"].items() if d["delta_ms"] > 0]
    if grow and dec["step_delta_ms"] > 0:
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
    if ev.outliers:
        n = sum(len(r["outliers"]) for _, r in ev.outliers)
        warm = all(o["warmup"] for _, r in ev.outliers for o in r["outliers"])
        parts.append(f"{n} slow step{'s' if n != 1 else ''} set apart from the means above "
                     f"(in {', '.join(lbl for lbl, _ in ev.outliers)}{'; warm-up?' if warm else ''})")
    parts.append(base["verdict"] if base.get("given") else "no baseline given")
    return "; ".join(parts)
