"""Plain-text table of a :class:`~.profile.Profile`, aligned for a terminal (``?format=text``, CLI).

One row per context bucket: steps, accepted tokens per step, implied decode tok/s, mean step ms
and mean ms per leaf phase; then the per-phase context fit ("ms per extra 1k tokens of context").
Under the header, what the profiler says it costs (the ``cost`` its ranks report; the largest).
"""

from __future__ import annotations

from ..model.names import Phase
from ..model.records import leaf_columns
from .profile import Profile

_SHORT = {
    "draft": "draft", "verify_attn": "v.attn", "verify_moe": "v.moe", "verify_rest": "v.rest",
    "draft_extend": "d.ext", "overhead": "ovhd", "unattributed": "unattr", "verify": "verify",
    "step": "step", "decode": "dec", "decode_attn": "dec.attn", "decode_moe": "dec.moe", "decode_rest": "dec.rest",
}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return out


def _total_share(c: dict) -> float:
    """A rank's whole share of the step (an older rank reports only its scheduler thread's)."""
    total = c.get("total_share")
    return c["step_share"] if total is None else total


def cost_line(ranks) -> str:
    """"profiler cost: 1.4% of the step in the scheduler's process: 38 µs/step on the scheduler
    thread (0.2%), drain thread 150 µs/record (1.2%)" from the rank that reports the largest total
    share, or "" when no rank has timed a step yet (its shares are None).  (A rank of an older version reports no drain
    share: its scheduler thread's share stands for the total.)"""
    reported = [(r.get("status") or {}).get("cost") for r in ranks if isinstance(r, dict)]
    costs = [c for c in reported if c and c.get("sampled_steps") and c.get("step_share") is not None]  # timed
    if not costs:
        return ""
    c = max(costs, key=_total_share)
    drain = c.get("drain_share")
    line = (f"profiler cost: {_total_share(c):.1%} of the step in the scheduler's process: "
            f"{c['sched_us_per_step']:.0f} µs/step on the scheduler thread ({c['step_share']:.1%}), "
            f"drain thread {c['drain_us_per_record']:.0f} µs/record" + (f" ({drain:.1%})" if drain is not None else ""))
    if c.get("events_per_step") is not None:
        line += f"; {c['events_per_step']} GPU events/step"
    return line + (f" (largest of {len(costs)} ranks)" if len(costs) > 1 else "")


def render(profile: Profile) -> str:
    buckets = profile.buckets
    leaves, present = leaf_columns(b.phases for b in buckets)  # a forward whole where its split was not read
    lines = [
        f"sglang-ctxprof  schema v{profile.schema_version}  timing={profile.timing}  "
        f"algorithms={','.join(profile.algorithms) or '-'}  "
        f"enabled={profile.enabled}  ranks={len(profile.ranks)}  dropped={profile.dropped}",
    ]
    if profile.degraded:
        lines.append(f"DEGRADED: {profile.degraded}")
    cost = cost_line(profile.ranks)
    if cost:
        lines.append(cost)
    if not buckets:
        lines.append("(no decode steps recorded yet)")
        return "\n".join(lines) + "\n"
    roof = any(b.roofline.get("available") for b in buckets)
    headers = ["ctx", "steps", "bs", "acc/step", "tok/s", "step ms"] + [f"{_SHORT[p]} ms" for p in present]
    headers += ["attn %HBM"] if roof else []
    rows = []
    for b, lv in zip(buckets, leaves):
        rows.append([
            b.label, str(b.steps), f"{b.mean_batch_size:.1f}", f"{b.accepted_per_step:.2f}",
            f"{b.decode_tok_s:.1f}", f"{b.mean_ms(Phase.STEP.value) or 0.0:.2f}",
            *[f"{b.phases[p].mean_ms:.2f}" if p in lv else "-" for p in present],
        ] + ([f"{b.roofline['pct']:.1f}" if b.roofline.get("available") else "-"] if roof else []))
    lines.append("")
    lines.append("decode steps by context bucket (mean ms per step)")
    lines += _table(headers, rows)
    if not roof:  # say why there is no roofline column (CPU run, unknown GPU, ...)
        why = next((b.roofline.get("reason") for b in buckets if b.roofline), None)
        lines.append(f"verify attention % of HBM roofline: unavailable ({why or 'not reported'})")
    accept = [a for a in profile.acceptance_by_ctx if (a.get("acceptance_by_position") or {}).get("p")]
    if accept:
        k = max(len(a["acceptance_by_position"]["p"]) for a in accept)
        lines.append("")
        lines.append("acceptance by draft position, P(position i accepted) (bucket = the request's own context)")
        lines += _table(["ctx", "req-steps", "AL"] + [f"p{i}" for i in range(1, k + 1)],
                        [[a["label"], str(a["acceptance_by_position"]["n_steps"]),
                          f"{a['acceptance_by_position']['mean_len']:.3f}"]
                         + [f"{x:.3f}" for x in a["acceptance_by_position"]["p"]]
                         + ["-"] * (k - len(a["acceptance_by_position"]["p"])) for a in accept])
    if profile.fits:
        lines.append("")
        lines.append("context cost fit per phase: ms = slope * (batch context / 1k tokens) + intercept")
        frows = [[_SHORT.get(p, p), f"{f.ms_per_1k_ctx:+.3f}", f"{f.intercept_ms:.3f}",
                  f"{f.r2:.2f}", str(f.n)] for p, f in profile.fits.items()]
        lines += _table(["phase", "ms/1k ctx", "intercept ms", "r2", "n"], frows)
    if profile.prefill:
        lines.append("")
        lines.append("prefill batches (recorded separately)")
        lines += _table(["ctx", "batches", "requests", "mean ms", "p90 ms", "cached tok"],
                        [[p.label, str(p.batches), str(p.requests), f"{p.stats.mean_ms:.2f}",
                          f"{p.stats.p90_ms:.2f}", str(p.cached_tokens)] for p in profile.prefill])
    return "\n".join(lines) + "\n"
