"""Plain-text rendering of a diagnosis (``GET /ctx_profile/diagnosis?format=text``, ``sglang-ctxprof
diagnose``, ``make demo``): the headline first, then flags, the decomposition, the per-phase slopes,
physics, the baseline and the what-if.  Pure."""

from __future__ import annotations

from typing import Any, Mapping

from .ledger_text import render_ledger


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_text(d: Mapping[str, Any]) -> str:
    out = [f"DIAGNOSIS ({d.get('source', '')})", "", d["headline"], ""]
    flags = d.get("flags") or []
    out.append("flags: " + ("none" if not flags else ""))
    out += [f"  [{f['kind']}] {f['message']}" for f in flags]
    dec = d.get("decomposition")
    if dec:
        lo, hi = dec["lo"], dec["hi"]
        out += ["", f"decomposition, bucket {lo['label']} -> {hi['label']} "
                    f"(log dtok/s = log(AL2/AL1) - log(T2/T1)):",
                f"  tok/s {lo['tok_s']:.2f} -> {hi['tok_s']:.2f} ({-dec['drop_pct']:+.1f}%): "
                f"log {dec['log_tok_s_ratio']:+.3f} = acceptance {dec['log_al_ratio']:+.3f} "
                f"(AL {lo['al']:.2f} -> {hi['al']:.2f}) + step time {dec['minus_log_step_ratio']:+.3f} "
                f"(T {lo['step_ms']:.2f} -> {hi['step_ms']:.2f} ms)",
                f"  shares of the change: acceptance {100 * dec['acceptance_share']:.0f}%, "
                f"step time {100 * dec['step_time_share']:.0f}%" if dec["acceptance_share"] is not None else
                "  shares of the change: none (tok/s changed too little to share out; they about cancel)"]
        for p, v in sorted(dec["phases"].items(), key=lambda kv: -kv[1]["delta_ms"]):
            share = v["share_of_step_growth"]  # None: the step barely changed
            out.append(f"    {p:<14} {v['lo_ms']:9.3f} -> {v['hi_ms']:9.3f} ms  ({v['delta_ms']:+.3f} ms"
                       + (f", {100 * share:+.0f}% of the step change)" if share is not None else ")"))
    ph = d.get("phases") or {}
    if ph:
        out += ["", "per-phase context fit (x = summed context of the step, per 1k tokens):"]
        for p, f in ph.items():
            out.append(f"  {p:<14} slope {f['ms_per_1k_ctx']:+9.4f} ms/1k  intercept {f['intercept_ms']:9.3f} ms"
                       f"  r² {f['r2']:.2f}  n {f['n']}  ({f['method']})")
    phys = d.get("physics") or {}
    out += ["", "physics: " + (str(phys.get("verdict") or "") if phys.get("available") else
                               f"unavailable: {phys.get('reason')}")]
    if phys.get("available"):
        out.append(f"  verify_attn {phys['measured_ms_per_1k']:.4f} ms/1k vs roofline "
                   f"{phys['roofline_ms_per_1k']:.4f} ms/1k ({phys['ratio']:.1f}x)")
    base = d.get("baseline") or {}
    out += ["", "baseline: " + base.get("verdict", "no baseline given")]
    if d.get("ledger"):
        out += [""] + render_ledger(d["ledger"])
    wi = d.get("whatif") or {}
    if wi.get("supported_range"):
        lo, hi = wi["supported_range"]
        out += ["", f"what-if (fits supported for {lo}-{hi} tokens of context per step):"]
        at = wi.get("at")
        if at:
            out.append(f"  at ctx {at['ctx']} (batch 1): step {_f(at['step_ms'])} ms, AL {at['al']:.2f} "
                       f"(from {at['al_from']}), {_f(at['tok_s'], '{:.1f}')} tok/s; {at['note']}")
        if wi.get("attention_at_roofline"):
            r = wi["attention_at_roofline"]
            out.append(f"  verify attention at the roofline in {r['bucket']}: {r['speedup']:.2f}x faster steps")
        for a in wi.get("draft_budget") or []:
            out.append(f"  {a['advice']}")
        if wi.get("draft_budget"):
            out.append(f"    measured: {wi['draft_budget'][0]['measured']}; assumed: {wi['draft_budget'][0]['assumed']}")
    return "\n".join(out) + "\n"
