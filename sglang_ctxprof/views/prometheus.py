"""Prometheus text exposition of a ``/ctx_profile`` body (``?format=prometheus``).

Labels are bounded: ``phase`` comes from the closed phase vocabulary and ``ctx_bucket`` from the
configured bucket ranges, never raw lengths.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..names import METRIC_ACCEPTED, METRIC_PHASE_SECONDS, METRIC_STEPS


def render(body: Mapping[str, Any]) -> str:
    out = [
        f"# HELP {METRIC_PHASE_SECONDS}_total Seconds spent per phase of speculative decode steps.",
        f"# TYPE {METRIC_PHASE_SECONDS}_total counter",
    ]
    for b in body.get("buckets") or []:
        for phase, st in b["phases"].items():
            out.append(f'{METRIC_PHASE_SECONDS}_total{{phase="{phase}",ctx_bucket="{b["label"]}"}} '
                       f"{st['total_ms'] / 1e3:.9f}")
    out += [f"# HELP {METRIC_STEPS}_total Speculative decode steps.", f"# TYPE {METRIC_STEPS}_total counter"]
    for b in body.get("buckets") or []:
        out.append(f'{METRIC_STEPS}_total{{ctx_bucket="{b["label"]}"}} {b["steps"]}')
    out += [f"# HELP {METRIC_ACCEPTED}_total Accepted tokens (incl. bonus).",
            f"# TYPE {METRIC_ACCEPTED}_total counter"]
    for b in body.get("buckets") or []:
        acc = b["accepted_per_step"] * b["steps"] * b["mean_batch_size"]
        out.append(f'{METRIC_ACCEPTED}_total{{ctx_bucket="{b["label"]}"}} {round(acc)}')
    return "\n".join(out) + "\n"
