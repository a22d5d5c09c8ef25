"""The automatic capture triggers (``collect.capture_triggers``): the slow step against its context
bucket, the host gap and its loss mark, and both off where several ranks would have to agree."""

from __future__ import annotations

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect.capture import Capture
from sglang_ctxprof.collect.capture_triggers import MIN_BUCKET_STEPS, CaptureSink
from sglang_ctxprof.collect.recorder import Recorder
from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CaptureSettings
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.testing.fake_profiler import CaptureScheduler


def settings(tmp_path, **kw) -> CaptureSettings:
    return CaptureSettings(dir=str(tmp_path), **{"interval_s": 60.0, "steps": 3, **kw})


def rec(step_id: int, ms: float, ctx: int = 300, t0: int = 0) -> StepRecord:
    return StepRecord(step_id=step_id, kind=names.KIND_DECODE, algorithm="EAGLE", rank=RankId(), rids=("a",),
                      ctx_lens=(ctx,), accepted=(1,), committed=(1,), finished=(False,), draft_tokens=4,
                      step_ms=ms, phases_ms={}, t_start_ns=t0)


def feed(cap: Capture, agg: Aggregator, r: StepRecord) -> None:
    agg.observe(r)
    cap.triggers.observe(r, agg, cap.request)


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
    assert not off.triggers.on
    cap, agg = Capture(settings(tmp_path, host_gap_ms=50.0)), Aggregator()
    feed(cap, agg, rec(1, 10.0, t0=1_000_000_000))
    feed(cap, agg, rec(2, 10.0, t0=1_030_000_000))  # 20 ms after the previous end
    assert cap.status()["fired"] == {}
    feed(cap, agg, rec(3, 10.0, t0=1_100_000_000))  # 60 ms
    assert cap.status()["fired"] == {names.TRIGGER_HOST_GAP: 1} and cap.current.trigger_step == 3


def test_an_idle_server_s_next_request_is_no_host_gap(tmp_path):
    """Every request of a step finished: the server may sit idle until the next one arrives, and the
    trigger (and the profile's host gaps) must not take that time for the scheduler's.  A capture
    taken then would also spend the cooling-off a real stall soon after needs."""
    from dataclasses import replace

    cap, agg = Capture(settings(tmp_path, host_gap_ms=50.0)), Aggregator()
    feed(cap, agg, rec(1, 10.0, t0=1_000_000_000))
    feed(cap, agg, replace(rec(2, 10.0, t0=1_020_000_000), finished=(True,)))
    feed(cap, agg, replace(rec(3, 10.0, t0=9_000_000_000), rids=("b",)))  # 8 s later: a new request
    assert cap.status()["fired"] == {}
    assert agg.host_gaps.count == 1 and agg.host_gaps.max == 10.0  # step 1 -> 2 only
    feed(cap, agg, replace(rec(4, 10.0, t0=9_100_000_000), rids=("b",)))  # b runs on: 90 ms is a gap
    assert cap.status()["fired"] == {names.TRIGGER_HOST_GAP: 1} and agg.host_gaps.count == 2


def test_automatic_triggers_are_off_when_ranks_would_have_to_agree(tmp_path):
    cap, s = Capture(settings(tmp_path, slow_factor=2.0)), CaptureScheduler()
    s.server_args.tp_size = 2
    cap.bind(s)
    assert not cap.triggers.on and cap.status()["triggers"][names.TRIGGER_SLOW_STEP]["on"] is False


def test_a_loss_mark_breaks_the_host_gap_the_trigger_measures(tmp_path):
    """Steps lost before the aggregator ran all the same: the recorder's loss mark reaches the
    capture sink in its place, and no host gap is measured across it; without it one fires."""
    for lost in (True, False):
        cap, agg = Capture(settings(tmp_path, host_gap_ms=50.0)), Aggregator()
        r = Recorder(agg, Guard(), sinks=[CaptureSink(cap.triggers, cap.request, agg)])
        r.submit(rec(1, 10.0, t0=1_000_000_000))
        if lost:
            r.lost()
        r.submit(rec(5, 10.0, t0=1_500_000_000))  # 490 ms after the previous end
        r.flush()
        assert cap.status()["fired"] == ({} if lost else {names.TRIGGER_HOST_GAP: 1})
