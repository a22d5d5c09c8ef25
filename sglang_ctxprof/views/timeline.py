"""One timeline: a deep capture's trace (SGLang's torch profiler) merged with ctxprof's own step
slices for the same steps, on the trace's clock.  Chrome trace-event JSON: Perfetto and
``chrome://tracing`` open it.

The capture trace keeps its processes, threads and events as exported (the ops and kernels, and our
``ctxprof.<phase> step=<id> ctx=<tokens>`` ranges around them).  ctxprof's step slices
(``trace_events.steps_trace``: each step and its phases laid back to back) are added as one more
process, ``sglang-ctxprof``, one track per rank.

Clocks.  Trace events sit at ``baseTimeNanoseconds + 1000 * ts`` ns in torch's clock; ctxprof's
records use the host wall clock (``time.time_ns()``).  The capture opened a ``ctxprof.clock_sync``
range between two wall-clock reads ``(a, b)`` (``CaptureInfo.sync_ns``), so the range's trace start
lies in ``[a, b]`` of wall time: the offset is taken at the midpoint, and ``(b - a) / 2`` bounds its
error (``otherData.clock``).  Without the sync range the trace's own base is trusted (offset 0).

Pure: takes the trace and the records as builtins.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..model.names import RANGE_CLOCK_SYNC
from .trace_events import PID, steps_trace

OUR_PID = PID  # the capture's pids are OS process ids, never 1 (init) in a server


def clock_offset(trace: Mapping[str, Any], sync_ns: Sequence[int]) -> tuple[int, int, bool]:
    """(trace_ns - wall_ns, error bound ns, aligned on the sync range)."""
    base = int(trace.get("baseTimeNanoseconds") or 0)
    a, b = (int(sync_ns[0]), int(sync_ns[1])) if sync_ns and len(sync_ns) == 2 else (0, 0)
    ev = next((e for e in trace.get("traceEvents") or () if e.get("name") == RANGE_CLOCK_SYNC
               and e.get("ph") == "X"), None)
    if ev is None or not a:
        return 0, 0, False
    at = base + int(round(float(ev["ts"]) * 1000))
    return at - (a + b) // 2, (b - a + 1) // 2, True


def merged_timeline(trace: Mapping[str, Any], capture: Mapping[str, Any],
                    ranks: Sequence[tuple[Any, Sequence[Mapping[str, Any]]]]) -> dict[str, Any]:
    """The capture ``trace`` with the step slices of ``ranks`` ((rank, step records) per rank)."""
    base = int(trace.get("baseTimeNanoseconds") or 0)
    offset, err, synced = clock_offset(trace, capture.get("sync_ns") or ())
    ours = steps_trace(ranks, max(1, sum(len(r) for _, r in ranks)))
    t0 = int(ours["otherData"]["t0_ns"])
    shift_us = (t0 + offset - base) / 1e3  # our ts are us from t0 (wall); theirs us from base (trace)
    events = list(trace.get("traceEvents") or ())
    for e in ours["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + shift_us
        events.append(e)
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = events
    out["otherData"] = {**(trace.get("otherData") or {}),
                        "ctxprof": {"capture": capture.get("id"), "trigger": capture.get("trigger"),
                                    "step_ids": list(capture.get("step_ids") or ()),
                                    "steps_merged": ours["otherData"]["steps"], "layout": ours["otherData"]["layout"]},
                        "clock": {"aligned_on": RANGE_CLOCK_SYNC if synced else "baseTimeNanoseconds",
                                  "offset_ns": offset, "error_bound_ns": err}}
    return out
