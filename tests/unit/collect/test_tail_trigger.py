"""The slow-request capture trigger (``collect.tail_trigger``): the trace policy's own judgement of a
running request, one ``rid`` capture per slow request, inside the capture budget."""

from __future__ import annotations

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect.capture import AUTO_RID_WAIT_STEPS, Capture
from sglang_ctxprof.collect.tail_trigger import MIN_STEPS, running_reason
from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CaptureSettings, CtxProfConfig
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.sinks import BindFacts
from sglang_ctxprof.testing.fake_profiler import CaptureScheduler, wait_state
from sglang_ctxprof.views.policy import TracePolicy


def rec(step_id: int, ms: float, rids=("a",), committed=None, finished=None) -> StepRecord:
    n = len(rids)
    return StepRecord(step_id=step_id, kind=names.KIND_DECODE, algorithm="EAGLE", rank=RankId(), rids=tuple(rids),
                      ctx_lens=(300,) * n, accepted=(2,) * n, committed=tuple(committed or (2,) * n),
                      finished=tuple(finished or (False,) * n), draft_tokens=4, step_ms=ms, phases_ms={})


def tail_capture(tmp_path, policy: TracePolicy, **kw) -> tuple[Capture, list]:
    box = [policy]
    cfg = CaptureSettings(dir=str(tmp_path), **{"interval_s": 60.0, "steps": 3, "slow_request": True, **kw})
    cap = Capture(cfg)
    cap.bind(CaptureScheduler(), BindFacts(policy=lambda: box[0]))  # the trigger asks the bind facts
    return cap, box


def feed(cap: Capture, *recs: StepRecord) -> None:
    agg = Aggregator()
    for r in recs:
        agg.observe(r)
        cap.triggers.observe(r, agg, cap.request)


def test_running_reason_asks_the_trace_policy_with_the_totals_so_far():
    pol = TracePolicy(slow_tok_s=20.0, slow_step_ms=250.0)
    assert running_reason(pol, 1, 2, 300.0, 300.0) == "step 300.0 ms > 250 ms"  # final at once
    assert running_reason(pol, MIN_STEPS - 1, 3, 3000.0, 100.0) == ""  # 1 tok/s, but too few steps for a rate
    assert running_reason(pol, MIN_STEPS, 4, 4000.0, 100.0) == "decode_tok_s 1.0 < 20"
    assert running_reason(pol, MIN_STEPS, 400, 4000.0, 100.0) == ""  # 100 tok/s, no slow step
    assert running_reason(None, 10, 1, 1e6, 1e6) == ""  # no policy (no trace sinks): never slow
    assert running_reason(TracePolicy(slow_tok_s=0.0, slow_step_ms=0.0), 10, 1, 1e6, 1e6) == ""


def test_off_by_default_and_on_through_one_knob():
    assert CtxProfConfig.from_env({}).capture.slow_request is False
    cfg = CtxProfConfig.from_env({names.ENV_CAPTURE_SLOW_REQUEST: "1"}).capture
    assert cfg.slow_request and cfg.auto
    assert Capture(CaptureSettings()).triggers.tail is None
    try:
        CtxProfConfig.from_env({names.ENV_CAPTURE_SLOW_REQUEST: "yes please"})
    except ValueError as exc:
        assert names.ENV_CAPTURE_SLOW_REQUEST in str(exc)
    else:
        raise AssertionError("a bad value is refused")


def test_a_slow_running_request_fires_one_rid_capture_of_its_next_steps(tmp_path):
    cap, _ = tail_capture(tmp_path, TracePolicy(slow_tok_s=0.0, slow_step_ms=250.0))
    feed(cap, rec(1, 20.0, rids=("a", "b")), rec(2, 400.0, rids=("a", "b"), finished=(False, True)))
    st = cap.status()
    assert st["fired"] == {names.TRIGGER_SLOW_REQUEST: 1}, st  # b finished in that step: nothing to capture
    assert st["triggers"][names.TRIGGER_SLOW_REQUEST]["on"] is True
    c = cap.current
    assert c.rid == "a" and c.trigger_step == 2 and "step 400.0 ms > 250 ms" in c.reason
    feed(cap, rec(3, 500.0, rids=("a",)))  # a is judged once: no second request, no suppression
    assert cap.status()["suppressed"] == {}
    s = CaptureScheduler()
    s.forward_ct = 3
    for rids in (("a",), ("a",), ("a",), ("a",)):
        s.step(cap, rids=rids)
    done = wait_state(cap, c.id)
    assert done.state == names.CAPTURE_DONE and done.step_ids == [4, 5, 6] and done.rids == ["a"]


def test_the_budget_holds_and_each_slow_request_is_suppressed_once(tmp_path):
    cap, _ = tail_capture(tmp_path, TracePolicy(slow_tok_s=0.0, slow_step_ms=250.0))
    feed(cap, rec(1, 400.0, rids=("a",)))
    assert cap.status()["fired"] == {names.TRIGGER_SLOW_REQUEST: 1}
    feed(cap, rec(2, 400.0, rids=("a", "b", "c")), rec(3, 400.0, rids=("a", "b", "c")))
    st = cap.status()
    assert st["fired"] == {names.TRIGGER_SLOW_REQUEST: 1}
    assert st["suppressed"] == {names.TRIGGER_SLOW_REQUEST: 2}, st  # b and c, once each
    assert len(st["captures"]) == 1


def test_the_policy_is_read_at_each_record_so_a_runtime_change_counts(tmp_path):
    cap, box = tail_capture(tmp_path, TracePolicy(slow_tok_s=0.0, slow_step_ms=0.0))
    feed(cap, *(rec(i, 400.0) for i in range(1, 6)))
    assert cap.status()["fired"] == {}  # nothing is slow by this policy
    box[0] = TracePolicy(slow_tok_s=1000.0, slow_step_ms=0.0)  # POST /ctx_profile/trace_policy
    feed(cap, rec(6, 400.0))
    assert cap.status()["fired"] == {names.TRIGGER_SLOW_REQUEST: 1} and "decode_tok_s" in cap.current.reason


def test_a_request_that_finished_before_its_capture_started_fails_it_soon(tmp_path):
    cap, _ = tail_capture(tmp_path, TracePolicy(slow_tok_s=0.0, slow_step_ms=250.0))
    feed(cap, rec(1, 400.0))
    cid = cap.current.id
    s = CaptureScheduler()
    for _ in range(AUTO_RID_WAIT_STEPS + 1):
        s.step(cap, rids=("other",))
    c = cap.find(cid)
    assert c.state == names.CAPTURE_FAILED and f"not seen in {AUTO_RID_WAIT_STEPS} steps" in c.error
    assert not cap.armed
    feed(cap, rec(2, 400.0, rids=("b",)))  # an automatic capture keeps its cooling-off: no storm of them
    assert cap.status()["suppressed"] == {names.TRIGGER_SLOW_REQUEST: 1} and cap.current is None


def test_tracking_is_dropped_when_a_request_finishes(tmp_path):
    cap, _ = tail_capture(tmp_path, TracePolicy(slow_tok_s=0.0, slow_step_ms=0.0))
    feed(cap, rec(1, 10.0, rids=("a", "b")), rec(2, 10.0, rids=("a", "b"), finished=(True, False)))
    assert cap.triggers.tail.tracked() == 1
    feed(cap, rec(3, 10.0, rids=("b",), finished=(True,)))
    assert cap.triggers.tail.tracked() == 0


def test_the_profiler_hands_the_trigger_its_exporters_live_policy_through_bind_facts():
    """The trigger reads the policy the exporters hold, as it is now, through the typed
    ``BindFacts.policy`` the profiler builds from ``ExporterSet.policy`` (a rename of either breaks
    this test and the type check, where a run-time attribute lookup silently turned the trigger off)."""
    from sglang_ctxprof.collect.profiler import Profiler
    from sglang_ctxprof.views.exporters import build

    p = Profiler(CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_SLOW_REQUEST: "1"}))
    sched = CaptureScheduler()
    assert p.bind_facts(sched).policy() is None  # no exporters: nothing judged slow
    p.attach_exporters(build(p.config, env={}))
    try:
        p.bind(sched)
        assert p.capture.triggers.facts.policy() is p.exporters.policy
        p.exporters.set_policy({"slow_step_ms": 5.0})
        pol = p.capture.triggers.facts.policy()
        assert pol is not None and pol.step_is_slow(6.0) and not pol.step_is_slow(4.0)
    finally:
        p.recorder.close()
