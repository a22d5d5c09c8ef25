"""The diagnosis's flags: what a reader must know beside the headline, one message each.

* ``downgrade``: a bucket ran in a slower execution mode than it could (eager instead of graphs...);
* ``acceptance_falls``: acceptance length falls with context by more than :data:`ACCEPT_TOL`;
* ``host_bubbles``: host time between (the median gap, times the gaps: idle time is no overhead)
  and inside steps above :data:`BUBBLE_SHARE` of the wall time;
* ``outlier_steps``: steps set apart as outliers (``aggregate.outliers``: how many, where, how
  much, "warm-up?");
* ``lost_records``: step records dropped or requests evicted from the history;
* ``captures``: the recent deep captures, with where to fetch them (``views.capture_refs``);
* ``invariant_violations``: the live self-audit found numbers that disagree with the engine's books
  or with themselves (``views.audit_view``);
* ``partial``: a rank did not answer, or a component that records (``guard.RECORDING``) failed on
  one (the served profile's ``ranks`` and ``degraded``): the verdict reads the rest.

Pure: imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from typing import Optional

from ..aggregate.acceptance import describe_exec
from ..aggregate.outliers import describe as describe_outliers
from . import capture_refs
from .audit_view import audit_flags
from .diagnosis_evidence import MIN_POINT_STEPS, Evidence

BUBBLE_SHARE = 0.10  # host time between/inside steps above this share of the wall time is flagged
ACCEPT_TOL = 0.05  # relative acceptance change below this reads "unchanged"


def flags(ev: Evidence, dec: Optional[dict]) -> list[dict[str, str]]:
    flags = []
    for label, x in ev.exec_modes:
        if x.get("downgrade"):
            flags.append({"kind": "downgrade", "message": f"bucket {label}: {describe_exec(x)}"})
    acc = [(lbl, v) for lbl, v in ev.acceptance if v and v.get("n_steps", 0) >= MIN_POINT_STEPS]
    if len(acc) >= 2 and acc[-1][1]["mean_len"] < acc[0][1]["mean_len"] * (1 - ACCEPT_TOL):
        flags.append({"kind": "acceptance_falls", "message":
                      f"acceptance length falls with context: {acc[0][1]['mean_len']:.2f} at {acc[0][0]} -> "
                      f"{acc[-1][1]['mean_len']:.2f} at {acc[-1][0]} (own-context buckets)"})
    between = ev.host.get("between_steps") or {}
    # the typical gap times the gaps (as the evidence's host-gap phase): a server idle between
    # requests leaves a few gaps of minutes, which are no scheduler overhead
    gaps = (between.get("p50_ms") or 0.0) * between.get("count", 0)
    inside = (ev.host.get("in_step") or {}).get("total_ms", 0.0)
    steps_ms = sum(p.step_ms * p.steps for p in ev.points)
    if steps_ms > 0 and (gaps + inside) / (gaps + inside + steps_ms) > BUBBLE_SHARE:
        share = (gaps + inside) / (gaps + inside + steps_ms)
        flags.append({"kind": "host_bubbles", "message":
                      f"host time outside the model calls is {100 * share:.0f}% of the scheduler's wall time "
                      f"({gaps:.0f} ms between steps at their median, {inside:.0f} ms inside run_batch; threshold "
                      f"{100 * BUBBLE_SHARE:.0f}%)"})
    for label, r in ev.outliers:
        flags.append({"kind": "outlier_steps", "message": describe_outliers(label, r)})
    if ev.dropped or ev.evicted:
        flags.append({"kind": "lost_records", "message": f"{ev.dropped} step records dropped, "
                                                         f"{ev.evicted} requests evicted from the history"})
    if ev.partial:
        flags.append({"kind": "partial", "message": "the verdict reads what the ranks recorded, and not all of "
                                                    "them did: " + "; ".join(ev.partial)})
    return flags + capture_refs.flag(ev.captures) + audit_flags(ev.audit)

