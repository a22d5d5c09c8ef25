"""The capture's budget and state machine (``collect.capture``) with a fake SGLang profiler manager.

The fake (``testing.fake_profiler``) mirrors ``SchedulerProfilerManager`` where the capture relies
on it.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect import hooks
from sglang_ctxprof.collect.capture import MIN_BUCKET_STEPS, Capture
from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CaptureSettings
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.testing.fake_profiler import CaptureScheduler, wait_state


def settings(tmp_path, **kw) -> CaptureSettings:
    return CaptureSettings(dir=str(tmp_path), **{"interval_s": 60.0, "steps": 3, **kw})


def test_a_capture_runs_n_steps_labels_phases_and_exports_off_the_thread(tmp_path):
    cap, s = Capture(settings(tmp_path)), CaptureScheduler()
    cap.bind(s)
    s.step(cap)
    assert not cap.armed  # nothing asked: ticks never run
    cid = cap.request(names.TRIGGER_MANUAL, now_s=1000.0)["capture"]["id"]
    assert cap.armed and hooks._around is hooks._around_plain
    s.step(cap, rids=())  # an idle batch does not start it
    assert cap.find(cid).state == names.CAPTURE_PENDING
    s.step(cap)
    assert cap.find(cid).state == names.CAPTURE_RUNNING and hooks._around is hooks._around_labelled
    assert s.profiler_manager.activities == ["CPU"] and cap.label.startswith("step=3 ctx=100")
    s.step(cap)
    s.step(cap)
    s.step(cap)  # the 4th tick stops it: 3 steps captured
    assert hooks._around is hooks._around_plain and cap.label == ""
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_DONE and c.step_ids == [3, 4, 5] and c.rids == ["a"]
    assert c.bytes == os.path.getsize(c.path) > 0 and c.path.startswith(str(tmp_path))
    assert c.sync_ns[0] <= c.sync_ns[1] and c.stop_ms >= 0 and c.export_ms > 0
    assert not s.profiler_manager.profile_in_progress and s.profiler_manager.torch_profiler is None
    assert s.profiler_manager.collected == 0  # no gc.collect() on the scheduler thread
    s.step(cap)
    assert not cap.armed


def test_the_budget_suppresses_and_counts(tmp_path):
    cap, s = Capture(settings(tmp_path, interval_s=60.0, max_steps=8)), CaptureScheduler()
    with pytest.raises(ValueError):
        cap.request(names.TRIGGER_MANUAL, steps=9)
    with pytest.raises(ValueError):
        cap.request(names.TRIGGER_MANUAL, steps=0)
    first = cap.request(names.TRIGGER_SLOW_STEP, now_s=1000.0)
    assert first["accepted"]
    busy = cap.request(names.TRIGGER_MANUAL, now_s=2000.0)
    assert not busy["accepted"] and "already" in busy["reason"]
    for _ in range(5):
        s.step(cap)
    wait_state(cap, first["capture"]["id"])
    cool = cap.request(names.TRIGGER_SLOW_STEP, now_s=1030.0)
    assert not cool["accepted"] and "cooling off" in cool["reason"] and cool["retry_after_s"] == 30.0
    assert cap.status()["suppressed"] == {names.TRIGGER_MANUAL: 1, names.TRIGGER_SLOW_STEP: 1}
    assert cap.request(names.TRIGGER_MANUAL, now_s=1060.0)["accepted"]
    assert cap.status()["fired"] == {names.TRIGGER_SLOW_STEP: 1, names.TRIGGER_MANUAL: 1}


def test_the_byte_cap_deletes_the_oldest_first(tmp_path):
    cap, s = Capture(settings(tmp_path, interval_s=0.0, max_mb=0.006, steps=1)), CaptureScheduler()
    ids = []
    for i in range(3):
        ids.append(cap.request(names.TRIGGER_MANUAL, now_s=float(i))["capture"]["id"])
        s.step(cap)
        s.step(cap)
        wait_state(cap, ids[-1])
    states = [cap.find(i).state for i in ids]
    assert states == [names.CAPTURE_DELETED, names.CAPTURE_DELETED, names.CAPTURE_DONE], states
    assert not os.path.exists(cap.find(ids[0]).path) and os.path.exists(cap.find(ids[2]).path)
    assert cap.status()["deleted"] == 2 and cap.bytes_kept == cap.find(ids[2]).bytes
    tiny = Capture(settings(tmp_path / "t", interval_s=0.0, max_mb=1e-6, steps=1))
    cid = tiny.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(tiny)
    s.step(tiny)
    c = wait_state(tiny, cid)
    assert c.state == names.CAPTURE_FAILED and "byte cap" in c.error and not os.path.exists(c.path)


def test_a_rid_capture_waits_for_its_request_and_stops_when_it_leaves(tmp_path):
    cap, s = Capture(settings(tmp_path, steps=5)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_RID, rid="r1")["capture"]["id"]
    s.step(cap, rids=("x",))
    assert cap.find(cid).state == names.CAPTURE_PENDING
    s.step(cap, rids=("x", "r1"))
    s.step(cap, rids=("r1",))
    s.step(cap, rids=("x",))  # r1 finished: stop after 2 of 5 steps
    c = wait_state(cap, cid)
    assert c.step_ids == [2, 3] and c.rids == ["x", "r1"]
    assert [x["id"] for x in cap.for_rid("r1")] == [cid] and cap.for_rid("nobody") == []


def test_a_rid_capture_passes_over_other_requests_prefills_between_its_steps(tmp_path):
    """SGLang runs a new request's prefill between two decode steps of the running ones: the capture
    of a running request passes it over (not one of its steps: no step id, no range of ours) and
    counts its next decode steps; a decode batch without it means it left; a capture never runs
    on through more than ``RID_PASS_STEPS`` prefills in a row."""
    from sglang_ctxprof.collect import hooks
    from sglang_ctxprof.collect.capture import RID_PASS_STEPS

    cap, s = Capture(settings(tmp_path, steps=3)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_RID, rid="r1")["capture"]["id"]
    s.step(cap, rids=("r1",), prefill=True)  # its own prefill: step 0
    s.step(cap, rids=("x",), prefill=True)  # another request's prefill: passed over
    assert cap.find(cid).state == names.CAPTURE_RUNNING and cap.label == "" and hooks._CAPTURE is None
    s.step(cap, rids=("r1", "x"))  # decode steps 2 and 3
    assert cap.label.startswith("step=3 ") and hooks._CAPTURE is cap
    s.step(cap, rids=("r1", "x"))
    s.step(cap, rids=("r1", "x"))  # three steps: stop
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_DONE and c.step_ids == [1, 3, 4], c

    cap, s = Capture(settings(tmp_path, steps=5, interval_s=0)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_RID, rid="r2")["capture"]["id"]
    s.step(cap, rids=("r2", "x"))
    s.step(cap, rids=("x",))  # a decode batch without it: it finished
    assert wait_state(cap, cid).step_ids == [1]
    cid = cap.request(names.TRIGGER_RID, rid="r3")["capture"]["id"]
    s.step(cap, rids=("r3",))
    for _ in range(RID_PASS_STEPS + 1):
        s.step(cap, rids=("y",), prefill=True)
    c = wait_state(cap, cid)
    assert c.step_ids == [3] and c.state == names.CAPTURE_DONE


def test_sglangs_running_profiler_is_left_alone(tmp_path):
    cap, s = Capture(settings(tmp_path)), CaptureScheduler()
    s.profiler_manager.profile_in_progress = True  # a user's /start_profile
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(cap)
    c = cap.find(cid)
    assert c.state == names.CAPTURE_FAILED and "already running" in c.error and not cap.armed
    assert hooks._around is hooks._around_plain


def test_an_idle_server_stops_a_running_capture_at_the_second_control_request(tmp_path):
    cap, s = Capture(settings(tmp_path, steps=8)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(cap)
    cap.idle(s)
    s.step(cap)
    cap.idle(s)  # a step ran since the last control request: keep going
    assert cap.find(cid).state == names.CAPTURE_RUNNING
    cap.idle(s)  # none since: the server is idle
    assert wait_state(cap, cid).step_ids == [1, 2]


def rec(step_id: int, ms: float, ctx: int = 300, t0: int = 0) -> StepRecord:
    return StepRecord(step_id=step_id, kind=names.KIND_DECODE, algorithm="EAGLE", rank=RankId(), rids=("a",),
                      ctx_lens=(ctx,), accepted=(1,), committed=(1,), finished=(False,), draft_tokens=4,
                      step_ms=ms, phases_ms={}, t_start_ns=t0)


def feed(cap: Capture, agg: Aggregator, r: StepRecord) -> None:
    agg.observe(r)
    cap.observe(r, agg)


def test_the_slow_step_trigger_judges_against_its_bucket_once_it_has_steps(tmp_path):
    cap, agg = Capture(settings(tmp_path, slow_factor=3.0, slow_run=2)), Aggregator()
    feed(cap, agg, rec(1, 500.0))  # warm-up: too few steps in the bucket to judge
    for i in range(2, MIN_BUCKET_STEPS + 2):
        feed(cap, agg, rec(i, 10.0))
    feed(cap, agg, rec(100, 50.0))
    assert cap.status()["fired"] == {}  # one slow step; two in a row are asked for
    feed(cap, agg, rec(101, 10.0))
    feed(cap, agg, rec(102, 50.0))
    feed(cap, agg, rec(103, 50.0))
    assert cap.status()["fired"] == {names.TRIGGER_SLOW_STEP: 1}
    c = cap.current
    assert c.trigger_step == 103 and "x" in c.reason


def test_the_host_gap_trigger_and_off_by_default(tmp_path):
    off = Capture(settings(tmp_path))
    assert not off.auto
    cap, agg = Capture(settings(tmp_path, host_gap_ms=50.0)), Aggregator()
    feed(cap, agg, rec(1, 10.0, t0=1_000_000_000))
    feed(cap, agg, rec(2, 10.0, t0=1_030_000_000))  # 20 ms after the previous end
    assert cap.status()["fired"] == {}
    feed(cap, agg, rec(3, 10.0, t0=1_100_000_000))  # 60 ms
    assert cap.status()["fired"] == {names.TRIGGER_HOST_GAP: 1} and cap.current.trigger_step == 3


def test_automatic_triggers_are_off_when_ranks_would_have_to_agree(tmp_path):
    cap, s = Capture(settings(tmp_path, slow_factor=2.0)), CaptureScheduler()
    s.server_args.tp_size = 2
    cap.bind(s)
    assert not cap.auto and cap.status()["triggers"][names.TRIGGER_SLOW_STEP]["on"] is False


def test_disabling_profiling_stops_a_running_capture_and_drops_a_pending_one(tmp_path):
    cap, s = Capture(settings(tmp_path, interval_s=0.0, steps=8)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(cap)
    cap.halt(s)
    assert wait_state(cap, cid).step_ids == [1] and hooks._around is hooks._around_plain
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    cap.halt(s)
    assert cap.find(cid).state == names.CAPTURE_FAILED and not cap.armed


def test_a_failure_inside_a_capture_ends_it_and_not_the_step(tmp_path):
    cap, s = Capture(settings(tmp_path)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(cap)
    prof = s.profiler_manager.torch_profiler
    s.profiler_manager._stop_profile = None  # SGLang changed under us: not callable
    for _ in range(4):
        s.step(cap)
    c = cap.find(cid)
    assert c.state == names.CAPTURE_FAILED and "TypeError" in c.error and not cap.armed
    assert prof.stopped and s.profiler_manager.torch_profiler is None  # torch's profiler is not left on
    assert hooks._around is hooks._around_plain


def test_a_declared_phase_block_is_a_profiler_range_only_while_a_capture_runs(tmp_path):
    import torch

    from sglang_ctxprof import api
    from sglang_ctxprof.collect.step import StepBuilder
    from sglang_ctxprof.model.guard import Guard

    b = StepBuilder(names.KIND_DECODE, 0)
    p = SimpleNamespace(active=True, guard=Guard(), current=lambda: b,
                        clock=SimpleNamespace(mark=time.perf_counter_ns))
    old, hooks.SESSION = hooks.SESSION, SimpleNamespace(profiler=p)
    cap = Capture(settings(tmp_path))
    cap.label = "step=7 ctx=70"
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with api.phase("draft"):
                pass
            hooks.label_phases(cap)
            with api.phase("verify"):
                pass
            hooks.label_phases(None)
    finally:
        hooks.SESSION = old
    got = [e.name for e in prof.events() if e.name.startswith(names.RANGE_PREFIX)]
    assert got == ["ctxprof.verify step=7 ctx=70"] and [m[0] for m in b.marks] == ["draft", "verify"]
