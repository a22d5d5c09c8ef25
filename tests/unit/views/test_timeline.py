"""The merged timeline (``views.timeline``): our step slices move onto the trace's clock."""

from __future__ import annotations

import json

from sglang_ctxprof.model import names
from sglang_ctxprof.views.timeline import OUR_PID, clock_offset, merged_timeline

BASE = 1_000_000_000_000  # the trace's baseTimeNanoseconds
WALL = 5_000_000  # our wall clock runs 5 ms behind the trace's clock in this example


def trace() -> dict:
    """A trace whose sync range starts at trace time BASE + 100 us, and a step range at + 200 us."""
    return {"baseTimeNanoseconds": BASE, "traceEvents": [
        {"ph": "X", "name": names.RANGE_CLOCK_SYNC, "pid": 77, "tid": 77, "ts": 100.0, "dur": 1.0},
        {"ph": "X", "name": names.RANGE_STEP + " step=5 ctx=300", "pid": 77, "tid": 77, "ts": 200.0, "dur": 50.0},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 77, "tid": 77, "ts": 210.0, "dur": 5.0}]}


def test_the_offset_comes_from_the_sync_range_with_its_bound():
    # the sync range opened between wall reads a and b around trace time BASE + 100 us
    at_wall = BASE + 100_000 - WALL
    off, err, synced = clock_offset(trace(), (at_wall - 2_000, at_wall + 2_000))
    assert synced and off == WALL and err == 2_000
    assert clock_offset({"traceEvents": []}, (1, 2)) == (0, 0, False)


def test_step_slices_land_on_the_profilers_step_range():
    at_wall = BASE + 100_000 - WALL
    rec = {"step_id": 5, "kind": names.KIND_DECODE, "t_start_ns": BASE + 200_000 - WALL, "step_ms": 0.05,
           "phases_ms": {"draft": 0.01, "verify": 0.03, "verify_rest": 0.03, "overhead": 0.01},
           "ctx_lens": [300], "rids": ["a"]}
    out = merged_timeline(trace(), {"id": "1-manual-0", "trigger": "manual", "step_ids": [5],
                                    "sync_ns": [at_wall - 1_000, at_wall + 1_000]}, [({"tp": 0}, [rec])])
    json.dumps(out)
    step = next(e for e in out["traceEvents"] if e.get("name") == "decode step")
    assert step["pid"] == OUR_PID and abs(step["ts"] - 200.0) < 1e-6 and abs(step["dur"] - 50.0) < 1e-6
    assert out["otherData"]["clock"] == {"aligned_on": names.RANGE_CLOCK_SYNC, "offset_ns": WALL,
                                         "error_bound_ns": 1_000}
    assert out["otherData"]["ctxprof"]["step_ids"] == [5] and out["baseTimeNanoseconds"] == BASE
    assert sum(1 for e in out["traceEvents"] if e.get("name") == "aten::mm") == 1  # theirs kept as is
