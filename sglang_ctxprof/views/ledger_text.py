"""Plain-text rendering of the speculation ledger (``aggregate.ledger``): one row per context with
both arms' step times, the speedup, what the accepted drafts saved and what speculation spent, both
attention and MoE costs side by side, then the slopes, the crossover and the verdict.  Used by the
diagnosis text, ``sweep --arms`` and ``make demo``.  Pure."""

from __future__ import annotations

from typing import Any, Mapping


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_ledger(led: Mapping[str, Any]) -> list[str]:
    if not led.get("available"):
        return [f"speculation ledger: unavailable ({led.get('reason', 'no plain baseline')})"]
    out = ["speculation ledger (per spec step, ms; plain = the plain-decode arm at the same context"
           + (f", {led['plain_source']}" if led.get("plain_source") else "") + "):"]
    head = ["ctx", "AL", "T_spec", "T_plain", "plain", "speedup", "saved", "draft", "d.ext", "verify+",
            "ovhd+", "net", "net/tok", "v.attn", "dec.attn", "infl", "v.moe", "dec.moe", "infl"]
    rows = []
    for r in led["rows"]:
        sp = r["spent_ms"]
        rows.append([r["label"], _f(r["al"]), _f(r["step_ms"]), _f(r["plain_step_ms"]), r["plain_from"],
                     _f(r["speedup"], "{:.3f}"), _f(r["saved_ms"]), _f(sp["draft"]), _f(sp["draft_extend"]),
                     _f(sp["verify_extra"]), _f(sp["overhead_extra"]), _f(r["net_ms"]),
                     _f(r["net_per_token_ms"]), _f(r["verify_attn_ms"]), _f(r["decode_attn_ms"]),
                     _f(r["verify_inflation"]), _f(r["verify_moe_ms"]), _f(r["decode_moe_ms"]),
                     _f(r["moe_inflation"])])
    widths = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
    out.append("  " + "  ".join(h.rjust(w) for h, w in zip(head, widths)))
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(x, widths)) for x in rows]
    for key in ("attention", "moe"):
        out.append(f"  {led[key]['verdict']}")
    c = led["crossover"]
    out.append("  crossover (speedup < 1): " + (f"~{c['ctx']:.0f} tokens, {c['how']} ({c['note']})"
                                                if c.get("ctx") is not None else f"none ({c['note']})"))
    out.append(f"  verdict: {led['verdict']}")
    return out
