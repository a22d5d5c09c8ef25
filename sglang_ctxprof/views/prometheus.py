"""Prometheus text exposition of a :class:`~.profile.Profile` (``?format=prometheus``).

It uses the same family names and labels as the live metrics of ``views/metrics.py`` (which SGLang's
``/metrics`` exports with ``--enable-metrics``), less the live families' ``model_name`` label (the
served profile merges ranks; a scrape job's labels name the server), so a dashboard that does not
select on ``model_name`` works on either:

* ``sglang_ctxprof_phase_seconds{phase, ctx_bucket}``: here a ``summary`` (``_count``, ``_sum`` and
  the 0.5/0.9/0.99 quantiles that ``/ctx_profile`` keeps) instead of the live histogram's ``le``
  buckets: the aggregate keeps log-scale quantile bins, not Prometheus bucket counts.  ``_count`` and
  ``_sum`` mean the same in both;
* ``sglang_ctxprof_accepted_tokens_total{ctx_bucket}``, ``sglang_ctxprof_steps_total{ctx_bucket}`` and
  ``sglang_ctxprof_request_steps_total{ctx_bucket}``;
* ``sglang_ctxprof_prefill_cached_tokens_total{ctx_bucket}``: prompt tokens found in the prefix
  cache, per prefill bucket (the batch's mean prompt length);
* ``sglang_ctxprof_position_accepted_total{ctx_bucket, position}`` and
  ``sglang_ctxprof_position_observed_total{ctx_bucket, position}`` from ``acceptance_by_ctx`` (the
  request's own context, as the live counters): their ratio is ``/ctx_profile``'s ``p_i``;
* ``sglang_ctxprof_invariant_violations_total{invariant}``: the ranks' self-audit (``audit_view``);
* ``sglang_ctxprof_requests_aborted_total{kind}``: ``totals.requests_aborted`` by how they waited.

Labels are bounded: ``phase`` comes from the closed phase vocabulary and ``ctx_bucket`` from the
configured bucket ranges, never raw lengths.  Values are totals since the last reset; the counters
are the profile's exact integer counts.
"""

from __future__ import annotations

from typing import Any

from ..model.names import (LABEL_ABORT_KIND, LABEL_CTX_BUCKET, LABEL_PHASE, LABEL_POSITION, METRIC_REQUESTS_ABORTED, MAX_POSITION_LABEL, METRIC_ACCEPTED, METRIC_PHASE_SECONDS, METRIC_POSITION_ACCEPTED,
                           METRIC_POSITION_OBSERVED, METRIC_REQUEST_STEPS, METRIC_STEPS, METRIC_CACHED_TOKENS)
from .audit_view import prometheus_lines
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
            lab = f'{LABEL_PHASE}="{_esc(phase)}",{LABEL_CTX_BUCKET}="{lb}"'
            for q, v in (("0.5", st.p50_ms), ("0.9", st.p90_ms), ("0.99", st.p99_ms)):
                out.append(f'{m}{{{lab},quantile="{q}"}} {v / 1e3:.9f}')
            out.append(f"{m}_count{{{lab}}} {st.count}")
            out.append(f"{m}_sum{{{lab}}} {st.total_ms / 1e3:.9f}")
    out += [f"# HELP {METRIC_ACCEPTED}_total Accepted tokens (incl. the bonus token) of decode steps.",
            f"# TYPE {METRIC_ACCEPTED}_total counter"]
    for b in buckets:
        out.append(f'{METRIC_ACCEPTED}_total{{{LABEL_CTX_BUCKET}="{_esc(b.label)}"}} {b.accepted}')
    out += [f"# HELP {METRIC_STEPS}_total Speculative decode steps.", f"# TYPE {METRIC_STEPS}_total counter"]
    for b in buckets:
        out.append(f'{METRIC_STEPS}_total{{{LABEL_CTX_BUCKET}="{_esc(b.label)}"}} {b.steps}')
    out += [f"# HELP {METRIC_REQUEST_STEPS}_total Request-steps (decode steps x batch size).",
            f"# TYPE {METRIC_REQUEST_STEPS}_total counter"]
    for b in buckets:
        out.append(f'{METRIC_REQUEST_STEPS}_total{{{LABEL_CTX_BUCKET}="{_esc(b.label)}"}} {b.req_steps}')
    out += [f"# HELP {METRIC_CACHED_TOKENS}_total Prompt tokens of prefill batches found in the prefix cache.",
            f"# TYPE {METRIC_CACHED_TOKENS}_total counter"]
    for p in profile.prefill:
        out.append(f'{METRIC_CACHED_TOKENS}_total{{{LABEL_CTX_BUCKET}="{_esc(p.label)}"}} {p.cached_tokens}')
    for name, key, what in ((METRIC_POSITION_ACCEPTED, "accepted", "was accepted"),
                            (METRIC_POSITION_OBSERVED, "observed", "was within the draft budget")):
        out += [f"# HELP {name}_total Request-steps whose draft position {what}.", f"# TYPE {name}_total counter"]
        for a in profile.acceptance_by_ctx:
            v = a["acceptance_by_position"]
            obs = v.get("observed") or []
            hits = v.get("accepted") or [round(p * o) for p, o in zip(v.get("p") or [], obs)]
            for i, (o, h) in enumerate(zip(obs, hits), start=1):
                if o and i <= MAX_POSITION_LABEL:
                    out.append(f'{name}_total{{{LABEL_CTX_BUCKET}="{_esc(a["label"])}",{LABEL_POSITION}="{i}"}} '
                               f'{h if key == "accepted" else o}')
    m = METRIC_REQUESTS_ABORTED + "_total"
    out += [f"# HELP {m} Requests SGLang aborted while they waited, by how they waited.", f"# TYPE {m} counter"]
    for kind, n in profile.totals.aborted_by_kind().items():
        out.append(f'{m}{{{LABEL_ABORT_KIND}="{kind}"}} {n}')
    out += prometheus_lines(profile.ranks)
    return "\n".join(out) + "\n"
