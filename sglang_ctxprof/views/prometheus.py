"""Prometheus text exposition of a :class:`~.profile.Profile` (``?format=prometheus``).

It uses the same family names and labels as the live metrics of ``views/metrics.py`` (which SGLang's
``/metrics`` exports with ``--enable-metrics``), so a dashboard works on either:

* ``sglang_ctxprof_phase_seconds{phase, ctx_bucket}``: here a ``summary`` (``_count``, ``_sum`` and
  the 0.5/0.9/0.99 quantiles that ``/ctx_profile`` keeps) instead of the live histogram's ``le``
  buckets: the aggregate keeps log-scale quantile bins, not Prometheus bucket counts.  ``_count`` and
  ``_sum`` mean the same in both;
* ``sglang_ctxprof_accepted_tokens_total{ctx_bucket}`` and ``sglang_ctxprof_steps_total{ctx_bucket}``.

Labels are bounded: ``phase`` comes from the closed phase vocabulary and ``ctx_bucket`` from the
configured bucket ranges, never raw lengths.  Values are totals since the last reset; the counters
are the profile's exact integer counts.
"""

from __future__ import annotations

from typing import Any

from ..model.names import METRIC_ACCEPTED, METRIC_PHASE_SECONDS, METRIC_STEPS
from .profile import Profile


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(profile: Profile) -> str:
    buckets = profile.buckets
    m = METRIC_PHASE_SECONDS
    out = [f"# HELP {m} Seconds per speculative decode step phase.", f"# TYPE {m} summary"]
    for b in buckets:
        lb = _esc(b.label)
        for phase, st in b.phases.items():
            lab = f'phase="{_esc(phase)}",ctx_bucket="{lb}"'
            for q, v in (("0.5", st.p50_ms), ("0.9", st.p90_ms), ("0.99", st.p99_ms)):
                out.append(f'{m}{{{lab},quantile="{q}"}} {v / 1e3:.9f}')
            out.append(f"{m}_count{{{lab}}} {st.count}")
            out.append(f"{m}_sum{{{lab}}} {st.total_ms / 1e3:.9f}")
    out += [f"# HELP {METRIC_ACCEPTED}_total Accepted tokens (incl. the bonus token) of decode steps.",
            f"# TYPE {METRIC_ACCEPTED}_total counter"]
    for b in buckets:
        out.append(f'{METRIC_ACCEPTED}_total{{ctx_bucket="{_esc(b.label)}"}} {b.accepted}')
    out += [f"# HELP {METRIC_STEPS}_total Speculative decode steps.", f"# TYPE {METRIC_STEPS}_total counter"]
    for b in buckets:
        out.append(f'{METRIC_STEPS}_total{{ctx_bucket="{_esc(b.label)}"}} {b.steps}')
    return "\n".join(out) + "\n"
