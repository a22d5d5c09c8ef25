"""Plain-text table of a ``/ctx_profile`` body, aligned for a terminal (``?format=text``, CLI).

One row per context bucket: steps, accepted tokens per step, implied decode tok/s, mean step ms
and mean ms per leaf phase; then the per-phase context fit ("ms per extra 1k tokens of context").
"""

from __future__ import annotations

from typing import Any, Mapping

from ..model.names import LEAF_PHASES, Phase

_SHORT = {
    "draft": "draft", "verify_attn": "v.attn", "verify_moe": "v.moe", "verify_rest": "v.rest",
    "draft_extend": "d.ext", "overhead": "ovhd", "unattributed": "unattr", "verify": "verify",
    "step": "step",
}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return out


def render(body: Mapping[str, Any]) -> str:
    buckets = body.get("buckets") or []
    present = [p for p in LEAF_PHASES if any(p in b["phases"] for b in buckets)]
    lines = [
        f"sglang-ctxprof  schema v{body.get('schema_version')}  timing={body.get('timing')}  "
        f"algorithms={','.join(body.get('algorithms') or []) or '-'}  "
        f"enabled={body.get('enabled')}  ranks={len(body.get('ranks') or [])}  dropped={body.get('dropped', 0)}",
    ]
    if body.get("degraded"):
        lines.append(f"DEGRADED: {body['degraded']}")
    if not buckets:
        lines.append("(no decode steps recorded yet)")
        return "\n".join(lines) + "\n"
    roof = any((b.get("roofline") or {}).get("available") for b in buckets)
    headers = ["ctx", "steps", "bs", "acc/step", "tok/s", "step ms"] + [f"{_SHORT[p]} ms" for p in present]
    headers += ["attn %HBM"] if roof else []
    rows = []
    for b in buckets:
        ph = b["phases"]
        rows.append([
            b["label"], str(b["steps"]), f"{b['mean_batch_size']:.1f}", f"{b['accepted_per_step']:.2f}",
            f"{b['decode_tok_s']:.1f}", f"{ph.get(Phase.STEP.value, {}).get('mean_ms', 0.0):.2f}",
            *[f"{ph[p]['mean_ms']:.2f}" if p in ph else "-" for p in present],
        ] + ([f"{b['roofline']['pct']:.1f}" if b["roofline"].get("available") else "-"] if roof else []))
    lines.append("")
    lines.append("decode steps by context bucket (mean ms per step)")
    lines += _table(headers, rows)
    if not roof:  # say why there is no roofline column (CPU run, unknown GPU, ...)
        why = next(((b.get("roofline") or {}).get("reason") for b in buckets if b.get("roofline")), None)
        lines.append(f"verify attention % of HBM roofline: unavailable ({why or 'not reported'})")
    fits = body.get("fits") or {}
    if fits:
        lines.append("")
        lines.append("context cost fit per phase: ms = slope * (batch context / 1k tokens) + intercept")
        frows = [[_SHORT.get(p, p), f"{f['ms_per_1k_ctx']:+.3f}", f"{f['intercept_ms']:.3f}",
                  f"{f['r2']:.2f}", str(f["n"])] for p, f in fits.items()]
        lines += _table(["phase", "ms/1k ctx", "intercept ms", "r2", "n"], frows)
    pre = body.get("prefill") or []
    if pre:
        lines.append("")
        lines.append("prefill batches (recorded separately)")
        lines += _table(["ctx", "batches", "requests", "mean ms", "p90 ms"],
                        [[p["label"], str(p["batches"]), str(p["requests"]), f"{p['mean_ms']:.2f}",
                          f"{p['p90_ms']:.2f}"] for p in pre])
    return "\n".join(lines) + "\n"
