"""Where one request's decode wall time goes: a waterfall that adds up to the wall time.

A request's decode tok/s is committed tokens over its wall time from the start of its first decode
step to the end of its last (host clock), which is more than the sum of its own steps.  Inside that
window every millisecond is one of:

* ``own_steps_ms``: its own decode steps (the whole batch's step: the request waits for it), by
  leaf phase (``records.leaf_ms``: a forward without its attention/MoE split counts whole).
  ``batch_sharing_ms`` says how much of them is the extra time of steps shared with other
  requests, against the same context bucket's mean step at batch size 1 where that was measured
  (else None): it is *part of* ``own_steps_ms``, not an extra term;
* ``others_prefill_ms``: other requests' prefill batches that ran in between (a mixed batch this
  request decoded a token inside is one: its ``decode_ms`` counts that step too, this keeps it here);
* ``other_decode_ms``: decode steps of the scheduler that did not carry this request;
* ``host_gaps_ms``: the scheduler's host time between consecutive steps (end of step N's
  ``run_batch`` to the start of step N+1's) plus host time inside ``run_batch`` outside the model
  call;
* ``unaccounted_ms``: the remainder (clock skew, steps that left the bounded timeline); it is
  reported, never folded into a part, so "adds up" is checked, not built in.

Pure: takes the request's step rows, the aggregator's ring of recent steps (``recent.RecentStep``
rows) and the batch-1 baselines per bucket.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from ..model.buckets import Bucketing
from ..model.names import KIND_PREFILL, Phase
from ..model.records import host_end_ns, leaf_ms
from .recent import RecentStep


def _row_end(r: Mapping[str, Any]) -> int:
    return host_end_ns(int(r["t_start_ns"]), float(r["step_ms"]), int(r.get("t_end_ns") or 0))


def waterfall(rows: list[Mapping[str, Any]], timeline: Iterable[RecentStep], bs1_ms: Mapping[int, float],
              bucketing: Bucketing) -> Optional[dict[str, Any]]:
    """The waterfall of one request from its decode ``rows`` (dicts as served), or None without any."""
    rows = sorted((r for r in rows if r.get("t_start_ns")), key=lambda r: r["t_start_ns"])
    if not rows:
        return None
    t0 = int(rows[0]["t_start_ns"])
    t1 = max(_row_end(r) for r in rows)
    wall_ms = (t1 - t0) / 1e6
    own_ids = {int(r["step_id"]) for r in rows}
    own: dict[str, float] = {}
    for r in rows:
        ph = leaf_ms(r.get("phases_ms") or {})
        if not ph:
            ph = {Phase.UNATTRIBUTED.value: float(r["step_ms"])}
        for p, ms in ph.items():
            own[p] = own.get(p, 0.0) + ms
    shared = [r for r in rows if int(r.get("batch_size", 1)) > 1]
    shared_ms = 0.0
    measured = 0
    for r in shared:
        base = bs1_ms.get(bucketing.index(int(r["ctx_len"])))
        if base is None:
            continue
        measured += 1
        shared_ms += max(0.0, float(r["step_ms"]) - base)
    sharing: Optional[float] = None if shared and not measured else shared_ms
    steps = sorted((s for s in timeline if s.t_start_ns >= t0 and s.t_end_ns <= t1 + 1),
                   key=lambda s: s.t_start_ns)
    complete = bool(steps) and {s.step_id for s in steps if s.kind != KIND_PREFILL} >= own_ids
    prefill = sum(s.step_ms for s in steps if s.kind == KIND_PREFILL)
    other_decode = sum(s.step_ms for s in steps if s.kind != KIND_PREFILL and s.step_id not in own_ids)
    gaps = 0.0
    prev_end = t0
    for s in steps:
        if s.t_start_ns > prev_end:
            gaps += (s.t_start_ns - prev_end) / 1e6
        gaps += max(0.0, (s.t_end_ns - s.t_start_ns) / 1e6 - s.step_ms)
        prev_end = max(prev_end, s.t_end_ns)
    parts = sum(own.values()) + prefill + other_decode + gaps
    return {
        "wall_ms": wall_ms,
        "own_steps_ms": own,
        "own_steps_total_ms": sum(own.values()),
        "others_prefill_ms": prefill,
        "other_decode_ms": other_decode,
        "batch_sharing_ms": sharing,
        "batch_sharing_steps": {"shared": len(shared), "with_bs1_baseline": measured},
        "host_gaps_ms": gaps,
        "unaccounted_ms": wall_ms - parts,
        "timeline_complete": complete,
        "steps": len(rows),
    }
