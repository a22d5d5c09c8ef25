"""The capture's budget and state machine (``collect.capture``) with a fake SGLang profiler manager.

The fake (``testing.fake_profiler``) mirrors ``SchedulerProfilerManager`` where the capture relies
on it.
"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest

from sglang_ctxprof.collect import hooks
from sglang_ctxprof.collect.capture import BUSY_RETRY_S, HISTORY, Capture, CaptureInfo
from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CaptureSettings
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
    busy = cap.request(names.TRIGGER_MANUAL, now_s=2000.0)  # past the interval, but one is pending
    assert not busy["accepted"] and f"{first['capture']['id']} is pending" in busy["reason"]
    assert busy["retry_after_s"] == BUSY_RETRY_S  # not 0: "now" would be refused again
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
    assert cap.status()["deleted"] == 2 and cap.files.bytes_kept == cap.find(ids[2]).bytes
    tiny = Capture(settings(tmp_path / "t", interval_s=0.0, max_mb=1e-6, steps=1))
    cid = tiny.request(names.TRIGGER_MANUAL)["capture"]["id"]
    s.step(tiny)
    s.step(tiny)
    c = wait_state(tiny, cid)
    assert c.state == names.CAPTURE_FAILED and "byte cap" in c.error and not os.path.exists(c.path)


def test_the_byte_cap_counts_the_files_of_captures_the_history_no_longer_lists(tmp_path):
    """The status lists the newest HISTORY captures; the cap counts every file this rank kept, so a
    server that keeps capturing never holds more than the cap on disk (per rank)."""
    s = CaptureScheduler()

    def capture(cap: Capture, i: int) -> CaptureInfo:
        cid = cap.request(names.TRIGGER_MANUAL, now_s=float(i))["capture"]["id"]
        s.step(cap)
        s.step(cap)
        return wait_state(cap, cid)

    one = capture(Capture(settings(tmp_path / "probe", interval_s=0.0, steps=1)), 0).bytes
    max_mb = (HISTORY + 4) * one / 2**20  # more than the history's files, less than all of them
    cap, d = Capture(settings(tmp_path / "caps", interval_s=0.0, max_mb=max_mb, steps=1)), tmp_path / "caps"
    for i in range(HISTORY + 8):
        capture(cap, i)
    on_disk = sum(os.path.getsize(d / f) for f in os.listdir(d))
    assert on_disk <= max_mb * 2**20 and cap.status()["bytes_kept"] == on_disk
    assert cap.status()["deleted"] == HISTORY + 8 - len(os.listdir(d)) > 0


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


def test_a_long_rid_is_captured_and_found_as_the_profiler_keeps_it(tmp_path):
    """A client's long rid is kept short everywhere (``model.rids``): the route and the slow-request
    trigger ask for the short one, and the batch's rids are read the same way."""
    from sglang_ctxprof.model.rids import short_rid

    long_rid = "r" * 300
    cap, s = Capture(settings(tmp_path, steps=2)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_RID, rid=short_rid(long_rid))["capture"]["id"]
    for _ in range(3):  # two captured steps, then the tick that stops it
        s.step(cap, rids=(long_rid, "x"))
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_DONE and c.step_ids == [1, 2], (c.state, c.error)
    assert c.rids == [short_rid(long_rid), "x"] and [x["id"] for x in cap.for_rid(short_rid(long_rid))] == [cid]


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


def test_a_profile_an_admin_started_after_stopping_a_capture_is_left_alone(tmp_path):
    """``POST /stop_profile`` mid-capture stops ours (SGLang writes its file); a ``/start_profile``
    after it is the admin's: the capture, at its last step, neither stops it nor claims its trace."""
    cap, s = Capture(settings(tmp_path / "caps", interval_s=0.0, steps=8)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL, now_s=0.0)["capture"]["id"]
    s.step(cap)
    s.step(cap)
    pm = s.profiler_manager
    pm._stop_profile()  # the admin's /stop_profile, then their own /start_profile
    user = SimpleNamespace(output_dir=str(tmp_path / "user"), profile_id="mine", profile_prefix="", activities=["CPU"])
    assert pm._profile(user).success
    theirs = pm.torch_profiler
    for _ in range(8):
        s.step(cap)
    c = wait_state(cap, cid)
    assert pm.profile_in_progress and pm.torch_profiler is theirs and not theirs.stopped
    assert c.state == names.CAPTURE_FAILED and "another caller" in c.error and c.path is None
    assert not cap.armed and hooks._around is hooks._around_plain


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


# ---- races with a trigger on another thread, and the byte cap ------------------------------------------
class Racing(CaptureInfo):
    """A kept capture that lets a trigger in (``Capture.request``, as the drain thread calls it) the
    first time ``attr`` of it is read: a reader that iterates the history meets an append."""

    def __init__(self, cap: Capture, attr: str) -> None:
        super().__init__(id="0-manual-0", trigger=names.TRIGGER_MANUAL, steps=1, state=names.CAPTURE_DONE)
        self.race = (cap, attr)

    def __getattribute__(self, name: str):
        race = object.__getattribute__(self, "__dict__").get("race")
        if race is not None and name == race[1]:
            self.__dict__["race"] = None
            race[0].request(names.TRIGGER_HOST_GAP, now_s=5000.0)
        return object.__getattribute__(self, name)


def test_status_and_find_read_the_history_while_a_trigger_appends_to_it(tmp_path):
    cap = Capture(settings(tmp_path, interval_s=0.0))
    cap.history.append(Racing(cap, "to_dict"))
    st = cap.status()  # a trigger fired while the status copied the captures
    assert [c["id"] for c in st["captures"]] == ["0-manual-0"] and len(cap.history) == 2
    cap = Capture(settings(tmp_path, interval_s=0.0))
    cap.history.append(Racing(cap, "id"))
    assert cap.find("nobody") is None and len(cap.history) == 2
    assert cap.find(cap.current.id) is cap.current


def exporting(cap: Capture, path, cid: str = "new") -> CaptureInfo:
    """A capture stopped on the scheduler thread, its trace to be written to ``path`` (``_export_async``)."""
    info = CaptureInfo(id=cid, trigger=names.TRIGGER_MANUAL, steps=1, state=names.CAPTURE_EXPORTING,
                       path=str(path))
    cap.history.append(info)
    cap.exporting, cap.armed = info, True
    return info


def kept(cap: Capture, path, size: int, cid: str) -> CaptureInfo:
    with open(path, "wb") as f:
        f.truncate(size)
    info = CaptureInfo(id=cid, trigger=names.TRIGGER_MANUAL, steps=1, state=names.CAPTURE_DONE,
                       path=str(path), bytes=size)
    cap.history.append(info)
    return info


class SizedProfiler:
    """torch's profiler after ``stop()``: ``export_chrome_trace`` writes the trace file (``size`` bytes)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "wb") as f:
            f.truncate(self.size)


def test_a_capture_alone_over_the_cap_is_deleted_and_the_older_ones_are_kept(tmp_path):
    mb = 1024 * 1024
    cap = Capture(settings(tmp_path, max_mb=1.0))
    old = [kept(cap, tmp_path / f"old{i}.json.gz", int(0.3 * mb), f"old{i}") for i in range(2)]
    new = exporting(cap, tmp_path / "new.json.gz")
    cap._export(new, SizedProfiler(2 * mb), new.path)  # the export thread's work
    assert new.state == names.CAPTURE_FAILED and "byte cap" in new.error and not os.path.exists(new.path)
    assert [c.state for c in old] == [names.CAPTURE_DONE] * 2 and all(os.path.exists(c.path) for c in old)
    assert cap.files.bytes_kept == 2 * int(0.3 * mb) and cap.files.deleted == 1 and not cap.armed
    # one that fits with the newest is kept, and the oldest go first to make room
    newer = exporting(cap, tmp_path / "newer.json.gz", "newer")
    cap._export(newer, SizedProfiler(int(0.6 * mb)), newer.path)
    assert [c.state for c in (*old, newer)] == [names.CAPTURE_DELETED, names.CAPTURE_DONE, names.CAPTURE_DONE]
    assert cap.files.bytes_kept == int(0.3 * mb) + int(0.6 * mb) and cap.files.deleted == 2


class Interleaved(Capture):
    """A capture where, on this thread's first read of ``attr`` (``current`` or ``exporting``) that
    finds it None, a trigger on another thread (``request``, as the drain thread) runs, given
    ``wait_s`` to finish: it waits for the lock where one is held."""

    def __init__(self, cfg: CaptureSettings, attr: str, wait_s: float = 0.5) -> None:
        super().__init__(cfg)
        self.attr, self.wait_s, self.other = attr, wait_s, None

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if value is None and name == self.__dict__.get("attr") and self.__dict__.get("other") is None \
                and threading.current_thread() is threading.main_thread():
            self.other = t = threading.Thread(target=self.request, args=(names.TRIGGER_HOST_GAP,),
                                              kwargs={"now_s": 9000.0})
            t.start()
            t.join(self.wait_s)
        return value


def test_the_end_of_an_export_never_disarms_a_capture_a_trigger_just_asked_for(tmp_path):
    cap = Interleaved(settings(tmp_path, interval_s=0.0), "exporting")
    info = exporting(cap, tmp_path / "new.json.gz")
    cap._end(info, names.CAPTURE_DONE)  # the export thread ends its capture while a trigger fires
    cap.other.join(5.0)
    assert cap.current is not None and cap.current.state == names.CAPTURE_PENDING
    assert cap.armed  # else no tick ever starts it, and every later trigger is refused


def test_a_tick_never_disarms_a_capture_a_trigger_just_asked_for(tmp_path):
    cap, s = Interleaved(settings(tmp_path, interval_s=0.0), "current", wait_s=5.0), CaptureScheduler()
    cap.armed = True  # the tick after an export ended: nothing pending, so it disarms
    s.step(cap)  # a trigger fires between its read of ``current`` and its write of ``armed``
    assert cap.current is not None and cap.armed
    s.step(cap)
    assert cap.current.state == names.CAPTURE_RUNNING


def _rank(tmp_path, broken: str, manager=None, waited=None) -> tuple[dict, list[tuple[int, bool, int]]]:
    """One rank of a TP group of two through the real hooks and control handler: a capture asked
    for over the control channel, then steps; ``broken``: a component of ours failed on this rank
    only; ``manager``: SGLang's profiler manager (a fake's class); ``waited(manager)``: this rank's
    waits at the TP group's barrier so far (default: the fake's count of its own).  After each step:
    (forward_ct, SGLang's profiler running, waits at the barrier)."""
    import fakes
    from sglang_ctxprof.control.handler import handle
    from sglang_ctxprof.control.protocol import encode
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.testing.fake_profiler import FakeProfilerManager
    from sglang_ctxprof.testing.session import instrumented
    from test_profiler import TARGETS, _steps

    with instrumented(TARGETS, CtxProfConfig(capture=settings(tmp_path / (broken or "ok")))) as session:
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        sched.profiler_manager = (manager or FakeProfilerManager)()
        sched.server_args.tp_size, sched.server_args.pp_size = 2, 1
        _steps(sched, reqs, 2)
        if broken:
            session.profiler.guard.fail(broken, RuntimeError("this rank only"))
        out = handle(encode(names.CMD_CAPTURE, steps=3, now=1000.0), sched, session)[names.CONTROL_KEY]
        seen = []
        for _ in range(6):
            _steps(sched, reqs, 1)
            pm = sched.profiler_manager
            seen.append((sched.forward_ct, pm.profile_in_progress, (waited or (lambda m: m.barriers))(pm)))
    return out, seen


@pytest.mark.parametrize("broken", ["hooks", "control"])
def test_a_rank_whose_hooks_or_control_failed_starts_and_stops_a_capture_with_the_others(tmp_path, broken):
    """SGLang's profiler stops with a barrier across the TP group: a rank that did not start the
    capture, or stopped it at another step, would leave the others waiting there for ever."""
    ok, ok_seen = _rank(tmp_path, "")
    out, seen = _rank(tmp_path, broken)
    assert ok["accepted"] is True and out["accepted"] is True, out
    assert ok_seen[-1][2] == 1 and seen == ok_seen


def test_files_are_removed_outside_the_lock_the_scheduler_thread_takes(tmp_path, monkeypatch):
    """While an export runs, the scheduler thread takes the capture's lock at every step: a removal of
    a large trace on a slow disk must not hold it (nor must a look at which files are there)."""
    from sglang_ctxprof.collect import capture as capture_mod

    mb = 1024 * 1024
    cap = Capture(settings(tmp_path, max_mb=1.0))
    old = kept(cap, tmp_path / "old.json.gz", int(0.6 * mb), "old")
    new = exporting(cap, tmp_path / "new.json.gz")
    held = []

    def step_finds_it_held() -> None:  # what a step on another thread finds: the lock free, or held
        got = cap._lock.acquire(blocking=False)
        held.append(not got)
        if got:
            cap._lock.release()

    def slow_fs(real):
        def call(path, *a, **kw):
            t = threading.Thread(target=step_finds_it_held)
            t.start()
            t.join()
            return real(path, *a, **kw)
        return call

    monkeypatch.setattr(capture_mod.os, "remove", slow_fs(os.remove))
    monkeypatch.setattr(capture_mod.os.path, "exists", slow_fs(os.path.exists))
    cap._export(new, SizedProfiler(int(0.6 * mb)), new.path)
    assert old.state == names.CAPTURE_DELETED and not os.path.exists(old.path) and new.state == names.CAPTURE_DONE
    assert held and not any(held), held


def test_a_rank_whose_capture_fails_to_start_still_waits_at_the_stop_barrier_with_the_others(tmp_path, monkeypatch):
    """A start that fails for a cause of this rank's own (its disk, its GPU's profiler busy): the
    other ranks ran theirs and wait at SGLang's stop barrier, so this one follows the same steps and
    waits there with them (torch.distributed's barrier, recorded here), then reports the failure."""
    import torch.distributed as dist

    from sglang_ctxprof.testing.fake_profiler import FakeProfilerManager

    waits: list = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda group=None: waits.append(group))

    class Busy(FakeProfilerManager):
        def _profile(self, req):
            return SimpleNamespace(success=False, message="CUPTI is busy on this GPU")

    ok, ok_seen = _rank(tmp_path, "", waited=lambda pm: len(waits))
    ok_waits, waits[:] = list(waits), []
    out, seen = _rank(tmp_path, "", manager=Busy, waited=lambda pm: len(waits))
    assert ok["accepted"] is out["accepted"] is True and ok_waits == waits == ["dp_tp_cpu_group"]
    assert [(ct, n) for ct, _, n in seen] == [(ct, n) for ct, _, n in ok_seen]  # at the same step
    assert not any(running for _, running, _ in seen) and any(running for _, running, _ in ok_seen)


def test_ranks_accept_the_next_capture_alike_while_one_of_them_still_exports(tmp_path, monkeypatch):
    """When an export ends is each rank's own (its export thread; a rank whose capture did not start
    has none): with several ranks a running export refuses nothing, so every rank accepts or refuses
    the next request alike (one that ran a capture alone would wait alone at the stop barrier)."""
    import torch.distributed as dist

    from sglang_ctxprof.testing import fake_profiler as fp

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    held, export = threading.Event(), fp.FakeTorchProfiler.export_chrome_trace
    monkeypatch.setattr(fp.FakeTorchProfiler, "export_chrome_trace", lambda self, p: held.wait(10) and export(self, p))

    class Busy(fp.FakeProfilerManager):
        def _profile(self, req):
            return SimpleNamespace(success=False, message="CUPTI is busy on this GPU")

    ranks = []
    for k, pm in enumerate((fp.FakeProfilerManager(), Busy())):
        cap, sched = Capture(settings(tmp_path / f"r{k}", interval_s=0.0, steps=2)), CaptureScheduler()
        sched.profiler_manager, sched.server_args.tp_size = pm, 2
        cap.bind(sched)
        ranks.append((cap, sched))
    try:
        assert [cap.request(names.TRIGGER_MANUAL, now_s=100.0)["accepted"] for cap, _ in ranks] == [True, True]
        for _ in range(4):
            for cap, sched in ranks:
                sched.step(cap)
                sched.forward_ct += 1
        assert [c.exporting is not None for c, _ in ranks] == [True, False]  # the first still exports
        assert [cap.request(names.TRIGGER_MANUAL, now_s=101.0)["accepted"] for cap, _ in ranks] == [True, True]
    finally:
        held.set()


def test_a_capture_the_history_lets_go_of_as_its_export_ends_keeps_its_file_in_the_books(tmp_path, monkeypatch):
    """With several ranks a capture may be asked for while another exports.  One that makes the
    history let go of the exporting capture as its export ends (its books done, its end not yet)
    must not leave its file out of the books: the capture ends in the same hold of the lock."""
    from sglang_ctxprof.testing import fake_profiler as fp

    held, export = threading.Event(), fp.FakeTorchProfiler.export_chrome_trace
    monkeypatch.setattr(fp.FakeTorchProfiler, "export_chrome_trace",
                        lambda self, p: (held.wait(10) if "-1-manual" in p else True) and export(self, p))
    cap, sched = Capture(settings(tmp_path, interval_s=0.0, steps=1)), CaptureScheduler()
    sched.server_args.tp_size = 2
    cap.bind(sched)
    ids = []
    for i in range(HISTORY):  # the first still exports while the others run and end
        ids.append(cap.request(names.TRIGGER_MANUAL, now_s=float(i))["capture"]["id"])
        sched.step(cap)
        sched.step(cap)
        if i:
            wait_state(cap, ids[-1])
    first, end = cap.find(ids[0]), Capture._end
    asked: list = []

    def _end(self, info, state, error=""):
        if info is first and state == names.CAPTURE_DONE and not asked:  # a request from another thread now
            t = threading.Thread(target=lambda: asked.append(cap.request(names.TRIGGER_MANUAL, now_s=99.0)))
            t.start()
            t.join(0.5)
        end(self, info, state, error)

    monkeypatch.setattr(Capture, "_end", _end)
    held.set()
    t0 = time.time()
    while not (asked and first.state != names.CAPTURE_EXPORTING) and time.time() - t0 < 120:
        time.sleep(0.01)
    assert asked and asked[0]["accepted"] and cap.find(ids[0]) is None  # the history let go of it
    assert [p for p, _ in cap.files.older] == [first.path] and first.state == names.CAPTURE_DONE


@pytest.mark.parametrize("where", ["batch_rids", "batch_ctx"])  # before the step is counted, after
def test_a_tick_that_fails_mid_capture_never_leaves_sglangs_profiler_recording(tmp_path, monkeypatch, where):
    """One rank: the capture is stopped at once (its trace holds the steps before).  Several ranks:
    it goes on, the failed step counted as the others count it, and stops at the same step, at
    SGLang's barrier (before, it ended failed there with the profiler on, and never came).  A
    failure on the step the others start or stop at: the test after this one."""
    from sglang_ctxprof.collect import adapter_capture

    real, fail_at = getattr(adapter_capture, where), {"ct": None}

    def failing(batch):
        if fail_at["ct"] == sched.forward_ct:
            raise RuntimeError("a batch SGLang changed under us")
        return real(batch)

    monkeypatch.setattr(adapter_capture, where, failing)
    seen = {}
    for ranks in (1, 2, "2-ok"):
        cap, sched = Capture(settings(tmp_path / str(ranks), steps=4)), CaptureScheduler()
        sched.server_args.tp_size = 1 if ranks == 1 else 2
        cap.bind(sched)
        cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
        fail_at["ct"] = None if ranks == "2-ok" else 2  # the capture's second step
        trace = []
        for _ in range(7):
            sched.step(cap)
            sched.forward_ct += 1
            trace.append((sched.forward_ct, sched.profiler_manager.profile_in_progress, sched.profiler_manager.barriers))
        seen[ranks] = trace
        c = wait_state(cap, cid)
        assert not sched.profiler_manager.profile_in_progress and sched.profiler_manager.barriers == 1
        assert ("RuntimeError" in c.error) is (ranks != "2-ok")
    assert seen[1][1][1:] == (False, 1)  # one rank: stopped at the failed step
    assert seen[2] == seen["2-ok"]  # several: stopped where a rank that never failed stops


def test_a_capture_whose_ticks_always_fail_stops_after_its_most_steps_on_every_rank(tmp_path, monkeypatch):
    """A failure at every tick, where the step cannot be counted either (SGLang's forward count reads
    the same), counts no step: the capture still stops, after ``most_ticks`` steps, the same on every
    rank (each ticks at every step), so no rank records for ever."""
    from sglang_ctxprof.collect import adapter_capture
    from sglang_ctxprof.collect.capture import most_ticks

    real, broken = adapter_capture.batch_rids, {"on": False}

    def batch_rids(batch):
        if broken["on"]:
            raise RuntimeError("every step")
        return real(batch)

    monkeypatch.setattr(adapter_capture, "batch_rids", batch_rids)
    for ranks in (1, 2):
        cap, sched = Capture(settings(tmp_path / str(ranks), steps=2)), CaptureScheduler()
        sched.server_args.tp_size = ranks
        cap.bind(sched)
        cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
        sched.step(cap)  # started, its first step counted
        broken["on"] = True  # from here on (one rank stops at its first failure)
        monkeypatch.setattr(adapter_capture, "forward_ct", lambda scheduler: 0)
        ran = 0
        while sched.profiler_manager.profile_in_progress and ran < 1000:
            sched.step(cap)
            sched.forward_ct += 1
            ran += 1
        broken["on"] = False
        assert not sched.profiler_manager.profile_in_progress and sched.profiler_manager.barriers == 1
        assert ran == (most_ticks(cap.find(cid)) if ranks == 2 else 1), ran
        assert wait_state(cap, cid).error


def test_uninstrument_during_a_capture_stops_it_and_leaves_no_labelling(tmp_path):
    """The mirror of instrument: a capture running when the session is torn down is stopped (one
    rank: SGLang's profiler must not stay on, refusing its own /start_profile), and the phase
    labelling, a module-level swap, does not outlive the session into the next one."""
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.model.config import CtxProfConfig

    cfg = CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_DIR: str(tmp_path)})
    session = CtxProfSession(cfg, targets=[])
    session.instrument()
    p, s = session.profiler, CaptureScheduler()
    p.bind(s)
    cid = p.capture.request(names.TRIGGER_MANUAL, now_s=1000.0)["capture"]["id"]
    s.step(p.capture)
    assert p.capture.find(cid).state == names.CAPTURE_RUNNING and s.profiler_manager.profile_in_progress
    assert hooks._around is hooks._around_labelled
    cap = p.capture
    session.uninstrument()
    assert hooks._around is hooks._around_plain
    assert not s.profiler_manager.profile_in_progress
    assert wait_state(cap, cid).state in (names.CAPTURE_DONE, names.CAPTURE_FAILED)


def test_uninstrument_ends_the_labelling_of_a_capture_started_while_profiling_was_off(tmp_path):
    """An armed capture ticks while profiling is off; with several ranks uninstrument does not stop
    it alone (they stop in lockstep), but the module-level labelling must still end."""
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.model.config import CtxProfConfig

    session = CtxProfSession(CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_DIR: str(tmp_path)}),
                             targets=[])
    session.instrument()
    p, s = session.profiler, CaptureScheduler()
    p.bind(s)
    session.disable()
    p.capture.ranks = 2  # as bind finds on a TP group
    p.capture.request(names.TRIGGER_MANUAL, now_s=1000.0)
    s.step(p.capture)
    assert hooks._around is hooks._around_labelled
    try:
        session.uninstrument()
        assert hooks._around is hooks._around_plain
    finally:
        hooks.label_phases(None)
        s.profiler_manager._stop_profile()


# the step a capture starts at (pending), its last counted step, the step it stops at; failing before
# the step is counted (batch_rids) or after (batch_ctx)
@pytest.mark.parametrize("where", ["batch_rids", "batch_ctx"])
@pytest.mark.parametrize("fail_ct", [0, 3, 4])
def test_a_rank_whose_tick_fails_on_the_start_or_stop_step_meets_the_others_at_the_barrier(tmp_path, monkeypatch,
                                                                                           fail_ct, where):
    """SGLang's stop barrier spans the TP group: a rank whose tick fails (a cause of its own) on the
    step the others start at, or stop at, must still reach the barrier at the same step (else one
    waits in the barrier while another runs a forward's collectives: a hang)."""
    import torch.distributed as dist

    from sglang_ctxprof.collect import adapter_capture

    waits: list = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda group=None: waits.append(group))
    real, fail = getattr(adapter_capture, where), {"on": False}

    def failing(batch):
        if fail["on"] and sched.forward_ct == fail_ct:
            raise MemoryError("this rank's own")
        return real(batch)

    monkeypatch.setattr(adapter_capture, where, failing)
    seen = {}
    for name in ("fails", "ok"):
        waits.clear()
        cap, sched = Capture(settings(tmp_path / name, steps=4)), CaptureScheduler()
        sched.server_args.tp_size = 2
        cap.bind(sched)
        assert cap.request(names.TRIGGER_MANUAL)["accepted"]
        fail["on"] = name == "fails"
        trace = []
        for _ in range(8):
            sched.step(cap)
            trace.append((sched.forward_ct, sched.profiler_manager.barriers + len(waits) > 0))
        seen[name] = trace
        assert not sched.profiler_manager.profile_in_progress
    assert seen["fails"] == seen["ok"] and [ct for ct, met in seen["ok"] if met][0] == 5


def test_a_rank_whose_tick_fails_on_a_rid_step_after_passed_over_prefills_passes_as_many_as_the_others(
        tmp_path, monkeypatch):
    """A rid capture passes over a few other requests' prefills between two of its steps (and counts
    them anew after each step of its own).  A rank whose tick fails on such a step counts it as the
    others do, and starts that count anew too, or a later run of prefills stops it a step early."""
    import torch.distributed as dist

    from sglang_ctxprof.collect import adapter_capture

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    real, fail = adapter_capture.batch_rids, {"on": False}

    def failing(batch):
        if fail["on"] and sched.forward_ct == 2:
            raise MemoryError("this rank's own")
        return real(batch)

    monkeypatch.setattr(adapter_capture, "batch_rids", failing)
    batches = [(("a",), False), (("b",), True), (("a", "b"), False)] + [((f"c{i}",), True) for i in range(18)] \
        + [(("a",), False)] * 4
    stopped = {}
    for name in ("fails", "ok"):
        cap, sched = Capture(settings(tmp_path / name, steps=8)), CaptureScheduler()
        sched.server_args.tp_size = 2
        cap.bind(sched)
        assert cap.request(names.TRIGGER_RID, rid="a")["accepted"]
        fail["on"] = name == "fails"
        for rids, prefill in batches:
            sched.step(cap, rids=rids, prefill=prefill)
            if not sched.profiler_manager.profile_in_progress and name not in stopped and cap.current is None:
                stopped[name] = sched.forward_ct
    assert stopped["fails"] == stopped["ok"], stopped


def test_one_rank_stopped_by_a_failure_after_counting_a_step_does_not_claim_that_step(tmp_path, monkeypatch):
    """The profiler stops before that step's forward runs: the capture's steps (its step records, the
    spans and the live page's rows that name it) are the ones its trace holds."""
    from sglang_ctxprof.collect import adapter_capture

    real = adapter_capture.batch_ctx

    def failing(batch):
        if sched.forward_ct == 1:
            raise MemoryError("this rank's own")
        return real(batch)

    monkeypatch.setattr(adapter_capture, "batch_ctx", failing)
    cap, sched = Capture(settings(tmp_path, steps=3)), CaptureScheduler()
    cap.bind(sched)
    cid = cap.request(names.TRIGGER_MANUAL)["capture"]["id"]
    for _ in range(4):
        sched.step(cap)
    c = wait_state(cap, cid)
    assert c.step_ids == [1] and "MemoryError" in c.error, c


def test_a_capture_asked_for_while_profiling_is_off_is_refused_and_blocks_nothing(tmp_path):
    """Off, nothing runs a capture: the control command refuses it on every rank (the route's 409);
    one an automatic trigger asked for from the records drained after the switch is failed when
    profiling comes back, so it neither captures whatever runs then nor refuses the next one."""
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.control.handler import handle
    from sglang_ctxprof.control.protocol import encode
    from sglang_ctxprof.model.config import CtxProfConfig

    session = CtxProfSession(CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_DIR: str(tmp_path),
                                                     "SGLANG_CTXPROF_CAPTURE_INTERVAL_S": "0"}), targets=[])
    session.instrument()
    try:
        p, s = session.profiler, CaptureScheduler()
        p.bind(s)
        session.disable()
        out = handle(encode(names.CMD_CAPTURE, steps=2, now=1000.0), s, session)["ctx_profile"]
        assert out["accepted"] is False and out["off"] and p.capture.current is None
        cid = p.capture.request(names.TRIGGER_HOST_GAP, now_s=1001.0)["capture"]["id"]  # a sink, after the switch
        handle(encode(names.CMD_ENABLE), s, session)
        assert p.capture.find(cid).state == names.CAPTURE_FAILED and not p.capture.armed
        assert handle(encode(names.CMD_CAPTURE, steps=2, now=1002.0), s, session)["ctx_profile"]["accepted"]
    finally:
        session.uninstrument()
        hooks.label_phases(None)


def test_an_enable_while_profiling_is_on_leaves_a_capture_alone(tmp_path):
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.control.handler import handle
    from sglang_ctxprof.control.protocol import encode
    from sglang_ctxprof.model.config import CtxProfConfig

    session = CtxProfSession(CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_DIR: str(tmp_path)}),
                             targets=[])
    session.instrument()
    try:
        p, s = session.profiler, CaptureScheduler()
        p.bind(s)
        cid = handle(encode(names.CMD_CAPTURE, steps=2, now=1000.0), s, session)["ctx_profile"]["capture"]["id"]
        handle(encode(names.CMD_ENABLE), s, session)  # already on
        assert p.capture.find(cid).state == names.CAPTURE_PENDING and p.capture.armed
    finally:
        p.capture.halt(s)
        session.uninstrument()
        hooks.label_phases(None)


def test_a_pending_capture_fails_past_its_wait_at_a_control_request_and_gives_back_its_cooling_off(tmp_path):
    """A rid that never comes, or an idle server: the next control request after ``wait_s`` (by the
    HTTP clock it carries, so every rank alike) fails the capture; the next one is not cooled off."""
    cap, s = Capture(settings(tmp_path, interval_s=600.0)), CaptureScheduler()
    for bad in (0, -1, float("nan"), names.CAPTURE_MAX_WAIT_S + 1):
        with pytest.raises(ValueError, match="wait_s"):
            cap.request(names.TRIGGER_RID, rid="x", wait_s=bad)
    cid = cap.request(names.TRIGGER_RID, rid="r-gone", now_s=1000.0, wait_s=5.0)["capture"]["id"]
    s.step(cap, rids=("other",))
    cap.idle(s, 1004.0)  # within its wait
    cap.idle(s)  # a command without the clock judges nothing
    assert cap.find(cid).state == names.CAPTURE_PENDING and cap.find(cid).wait_s == 5.0
    assert not cap.request(names.TRIGGER_MANUAL, now_s=1004.5)["accepted"]  # in the way meanwhile
    cap.idle(s, 1005.5)
    c = cap.find(cid)
    assert c.state == names.CAPTURE_FAILED and c.error == "not started in 5 s: request r-gone not seen", c
    assert not cap.armed and cap.last_s is None
    manual = cap.request(names.TRIGGER_MANUAL, now_s=1006.0)  # no step ran: an idle server
    assert manual["accepted"] and manual["capture"]["wait_s"] == names.CAPTURE_WAIT_S
    cap.idle(s, 1006.0 + names.CAPTURE_WAIT_S + 1)
    assert cap.find(manual["capture"]["id"]).error.endswith(": no step ran")
    assert cap.request(names.TRIGGER_MANUAL, now_s=1070.0)["accepted"]  # still not cooled off
    s.step(cap)
    cap.idle(s, 5000.0)  # running: its wait no longer counts
    assert cap.current.state == names.CAPTURE_RUNNING


def test_cancel_fails_a_pending_capture_and_stops_a_running_one_with_its_steps(tmp_path):
    cap, s = Capture(settings(tmp_path, interval_s=600.0, steps=8)), CaptureScheduler()
    assert cap.cancel(s) == {"cancelled": None, "reason": "no capture is pending or running"}
    first = cap.request(names.TRIGGER_RID, rid="typo", now_s=1000.0)["capture"]["id"]
    assert cap.cancel(s, "9-manual-1") == {"cancelled": None, "reason": "capture 9-manual-1 not found"}
    out = cap.cancel(s, first)["cancelled"]
    assert out["state"] == names.CAPTURE_FAILED and out["cancelled"] and out["error"] == "cancelled before it started"
    assert not cap.armed
    second = cap.request(names.TRIGGER_MANUAL, now_s=1001.0)  # the cooling-off was given back
    assert second["accepted"]
    cid = second["capture"]["id"]
    s.step(cap)
    s.step(cap)
    assert cap.cancel(s, first) == {"cancelled": None, "reason": f"capture {first} is {names.CAPTURE_FAILED}"}
    out = cap.cancel(s)["cancelled"]
    # the reply is the capture as it is then: its export (a thread of its own) may have ended already
    assert out["id"] == cid and out["cancelled"] and out["state"] in (names.CAPTURE_EXPORTING, names.CAPTURE_DONE)
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_DONE and c.step_ids == [1, 2] and os.path.getsize(c.path) > 0
    assert not s.profiler_manager.profile_in_progress
    cool = cap.request(names.TRIGGER_MANUAL, now_s=1002.0)  # a capture that ran keeps its cooling-off
    assert not cool["accepted"] and "cooling off" in cool["reason"]


def test_ranks_end_a_pending_capture_alike_by_the_clock_each_command_carries(tmp_path):
    """The control handler judges the deadline by the command's ``now``: each rank, fed the same
    commands at its own time and steps, fails the capture at the same command and takes the next."""
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.control.handler import handle
    from sglang_ctxprof.control.protocol import encode
    from sglang_ctxprof.model.config import CtxProfConfig

    seen = []
    for k, steps in enumerate((0, 3)):  # one rank idle, one stepping (the rid never in its batch)
        session = CtxProfSession(CtxProfConfig.from_env({names.ENV_LOG: "off", names.ENV_CAPTURE_INTERVAL_S: "600",
                                                         names.ENV_CAPTURE_DIR: str(tmp_path / str(k))}), targets=[])
        session.instrument()
        try:
            p, s = session.profiler, CaptureScheduler()
            p.bind(s)

            def ask(**args) -> dict:
                return handle(encode(names.CMD_CAPTURE, **args), s, session)[names.CONTROL_KEY]

            outs = [ask(rid="r-gone", wait_s=2.0, now=1000.0)["accepted"]]
            for _ in range(steps):
                s.step(p.capture, rids=("other",))
                time.sleep(0.01)
            outs += [ask(steps=2, now=1001.9)["accepted"], ask(steps=2, now=1002.1)["accepted"]]
            seen.append((outs, [c.state for c in p.capture.history]))
        finally:
            session.uninstrument()
    assert seen[0] == seen[1] == ([True, False, True], [names.CAPTURE_FAILED, names.CAPTURE_PENDING]), seen


def test_an_admins_capture_that_cannot_start_on_one_rank_gives_back_its_cooling_off(tmp_path):
    """SGLang's profiler busy (an admin's /start_profile): the capture fails at its first step with
    nothing captured, and the next one an admin asks for is not refused for the whole interval."""
    cap, s = Capture(settings(tmp_path, interval_s=900.0)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL, now_s=1000.0)["capture"]["id"]
    s.profiler_manager.profile_in_progress = True
    s.step(cap)
    c = cap.find(cid)
    assert c.state == names.CAPTURE_FAILED and c.step_ids == [], c
    s.profiler_manager.profile_in_progress = False
    assert cap.request(names.TRIGGER_MANUAL, now_s=1001.0)["accepted"]



def test_a_rid_capture_is_not_idle_while_it_passes_over_other_requests_prefills(tmp_path):
    """The CLI polls status every 0.5 s and the live page every 3 s: a control read that finds the
    capture passing over another request's prefill must not stop it as idle (its request decodes on)."""
    cap, s = Capture(settings(tmp_path, interval_s=0.0, steps=8)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_RID, steps=8, rid="a", now_s=1000.0)["capture"]["id"]
    for _ in range(3):
        s.step(cap, ("a",))
    cap.idle(s, now_s=1001.0)
    s.step(cap, ("b",), prefill=True)  # passed over: a step all the same
    cap.idle(s, now_s=1001.5)
    assert cap.find(cid).state == names.CAPTURE_RUNNING
    for _ in range(6):  # its last five steps, and the one it stops at
        s.step(cap, ("a",))
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_DONE and len(c.step_ids) == 8 and not c.error


def test_an_export_that_fails_midway_leaves_no_partial_file(tmp_path, monkeypatch):
    """A disk that fills mid-export: the capture fails, and the part written is removed (a failed
    capture's file is counted by no byte cap, and no reader could open it)."""
    from sglang_ctxprof.testing import fake_profiler

    def partial(self, path):
        with open(path, "wb") as f:
            f.write(b"\x1f\x8b" + bytes(100))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fake_profiler.FakeTorchProfiler, "export_chrome_trace", partial)
    cap, s = Capture(settings(tmp_path, steps=2)), CaptureScheduler()
    cid = cap.request(names.TRIGGER_MANUAL, now_s=1000.0)["capture"]["id"]
    for _ in range(3):
        s.step(cap)
    c = wait_state(cap, cid)
    assert c.state == names.CAPTURE_FAILED and "No space left" in c.error and c.path
    assert not os.path.exists(c.path)
