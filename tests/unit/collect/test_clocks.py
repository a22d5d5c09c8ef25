"""The timing abstraction: CPU path exact against an injected monotonic clock, CUDA path on fake events.

* CPU: a fake model "sleeps" by advancing the fake time of the profiler's injected ``CpuClock``; every phase of the record
  equals the injected durations exactly (no tolerance), and the leaves add up to the step.
* CUDA (``CudaEventClock`` on ``fake_cuda``): no read before the device reached the end event
  (``elapsed_ms`` is None, never an exception or a guess), pooled events, no synchronize.
* The clock choice (``config.clock``): the thread clock leaves out time the thread does not run, labels its
  records ``cpu_thread`` with leaves that still sum to the step; ``reset(clock)`` switches between steps.
* ``Parked``: bounded FIFO of unresolved steps, retried oldest first, overflow counted.
"""

from __future__ import annotations

import time

import pytest

import fakes
from fakes import Batch, Req, Result
from sglang_ctxprof.collect import hooks
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.testing.fake_cuda import FakeDevice
from sglang_ctxprof.collect.session import CtxProfSession
from sglang_ctxprof.testing.session import Capture
from sglang_ctxprof.collect.clocks import CpuClock, CudaEventClock, Parked, cpu_clock, make_clock, make_graph_timer
from sglang_ctxprof.model import names

NOW = [10**12]
SLEEP_MS = {"draft": 3.0, "attn": 2.0, "moe": 1.25, "rest": 0.5, "draft_extend": 4.0, "overhead": 0.75}


def fake_sleep(key):
    NOW[0] += int(SLEEP_MS[key] * 1e6)


class Attn:
    def forward(self):
        fake_sleep("attn")


class MoE:
    def forward(self):
        fake_sleep("moe")


class Target_:
    def __init__(self):
        self.attn, self.moe = Attn(), MoE()

    def forward_batch_generation(self, batch, is_verify=False):
        for _ in range(2):  # two layers
            self.attn.forward()
            self.moe.forward()
        fake_sleep("rest")


class Worker:
    def __init__(self):
        self.target = Target_()

    def forward_batch_generation(self, batch):
        self.draft(batch)
        self.target.forward_batch_generation(batch, is_verify=True)
        self.draft_extend(batch)
        fake_sleep("overhead")
        return Result([2] * len(batch.reqs))

    def draft(self, batch):
        fake_sleep("draft")

    def draft_extend(self, batch):
        fake_sleep("draft_extend")


class Sched(fakes.Scheduler):
    """SGLang-shaped scheduler of tests/unit/fakes.py driving this module's fake-clock worker."""

    def __init__(self):
        super().__init__(Worker())


M = __name__
TARGETS = [Target(f"{M}.{p}", h) for p, h in (
    ("Sched.run_batch", "run_batch"), ("Sched.process_batch_result", "process_batch_result"),
    ("Target_.forward_batch_generation", "verify"), ("Worker.draft", "draft"),
    ("Worker.draft_extend", "draft_extend"), ("Attn.forward", "attn"), ("MoE.forward", "moe"))]


def test_cpu_clock_is_exact_against_injected_monotonic_clock():
    session = CtxProfSession(CtxProfConfig(), targets=TARGETS, clock=CpuClock(lambda: NOW[0]))
    assert set(session.instrument().values()) == {"ok"}
    p = session.profiler
    cap = Capture(p)
    try:
        s = Sched()
        for _ in range(3):
            b = Batch([Req("a", 50)])
            s.process_batch_result(b, s.run_batch(b))
        recs = cap.records()
    finally:
        session.uninstrument()
    assert len(recs) == 3 and all(r.timing == "cpu" for r in recs)
    for r in recs:
        ph = r.phases_ms
        assert ph["draft"] == 3.0 and ph["draft_extend"] == 4.0
        assert ph["verify_attn"] == 4.0 and ph["verify_moe"] == 2.5 and ph["verify_rest"] == 0.5
        assert ph["verify"] == 7.0 and ph["overhead"] == 0.75
        assert r.step_ms == 14.75 and r.leaf_sum_ms() == 14.75


def test_cpu_clock_real_sleep_lower_bound():
    c = CpuClock()
    a = c.mark()
    time.sleep(0.002)
    assert c.elapsed_ms(a, c.mark()) >= 2.0


def test_cuda_clock_no_read_before_device_done_and_pooling():
    dev = FakeDevice()
    clock = CudaEventClock(event_factory=lambda: dev.Event(enable_timing=True), pool_size=8)
    a = clock.mark()
    dev.kernel(1.5)
    b = clock.mark()
    assert clock.elapsed_ms(a, b) is None  # launched, not executed: no number, no exception
    dev.run(max_ops=2)  # the device ran the first record and the kernel, not the end record
    assert clock.elapsed_ms(a, b) is None
    dev.run()
    assert clock.elapsed_ms(a, b) == 1.5
    clock.release(a)
    clock.release(b)
    for _ in range(50):  # steady state reuses the pool
        x, y = clock.mark(), clock.mark()
        dev.run()
        assert clock.elapsed_ms(x, y) == 0.0
        clock.release(x)
        clock.release(y)
    assert clock.created == 2 and dev.syncs == 0


def test_plain_event_recorded_in_capture_is_not_a_timer():
    """Why graph timing needs external=True: the fake follows CUDA and refuses to time it."""
    dev = FakeDevice()
    with dev.graph() as g:
        a = dev.Event(enable_timing=True)
        a.record()
        b = dev.Event(enable_timing=True)
        b.record()
    g.replay()
    dev.run()
    with pytest.raises(RuntimeError):
        a.elapsed_time(b)


def test_make_clock_on_cpu():
    assert isinstance(make_clock("cpu"), CpuClock)
    assert make_graph_timer("cpu") is None


def test_parked_fifo_retry_and_overflow():
    ready = set()
    evicted = []
    q = Parked(maxlen=3)
    for i in range(5):
        q.push(i, evicted.append)
    assert evicted == [0, 1] and q.lost == 2 and len(q) == 3
    assert q.retry(lambda i: i in ready) == 0
    ready.update({2, 4})
    assert q.retry(lambda i: i in ready) == 1 and len(q) == 2  # 3 not ready: stop (stream order)
    ready.add(3)
    assert q.retry(lambda i: i in ready) == 2 and len(q) == 0


def test_block_hooks_step_aside_while_torch_compiles(monkeypatch):
    session = CtxProfSession(CtxProfConfig(), targets=TARGETS, clock=CpuClock(lambda: NOW[0]))
    session.instrument()
    p = session.profiler
    cap = Capture(p)
    monkeypatch.setattr(hooks, "IS_COMPILING", lambda: True)  # after instrument(), which resolves it
    try:
        s = Sched()
        b = Batch([Req("a", 50)])
        s.process_batch_result(b, s.run_batch(b))
        (r,) = cap.records()
    finally:
        session.uninstrument()
    assert r.phases_ms["verify_attn"] == 0.0 and r.phases_ms["verify_rest"] == r.phases_ms["verify"] == 7.0


# ---- the simulated device answers like c10/cuda/CUDAEvent.h where our code relies on it ---------
def test_fake_event_semantics_follow_cuda():
    dev = FakeDevice()
    never = dev.Event(enable_timing=True)
    assert never.query() is True  # an event never recorded is "complete" on CUDA
    done = dev.Event(enable_timing=True)
    done.record()
    dev.run()
    with pytest.raises(ValueError):  # ... and elapsed_time refuses it
        never.elapsed_time(done)
    plain = dev.Event()
    plain.record()
    dev.run()
    with pytest.raises(ValueError):  # timing needs enable_timing on both events
        plain.elapsed_time(done)
    with dev.graph():
        captured = dev.Event(enable_timing=True)
        captured.record()
    with pytest.raises(RuntimeError):  # a plain record in capture is a fork/join marker, not a timer
        captured.query()


def test_fake_graph_holds_no_reference_to_its_events():
    import gc

    dev = FakeDevice()
    with dev.graph() as g:
        a = dev.Event(enable_timing=True, external=True)
        a.record()
        dev.kernel(1.0)
        b = dev.Event(enable_timing=True, external=True)
        b.record()
    g.replay()
    dev.run()
    assert a.elapsed_time(b) == 1.0
    del a, b
    gc.collect()
    g.replay()  # no error (the H200's answer, probe P6); nothing holds the handles, nothing changes
    dev.run()
    assert dev.stray_records == 0


def test_fake_streams_order_work_and_capture_side_branches():
    dev = FakeDevice()
    main, side = dev.Stream("main"), dev.Stream("side")
    with dev.stream(main):
        with dev.graph() as g:
            side.wait_stream(main)  # fork: the side stream joins the capture
            with dev.stream(side):
                s = dev.Event(enable_timing=True, external=True)
                s.record()
                dev.kernel(2.0)
                e = dev.Event(enable_timing=True, external=True)
                e.record()
            main.wait_stream(side)  # join
        dev.kernel(1.0)
        g.replay()
    dev.run()
    assert s.elapsed_time(e) == 2.0
    with pytest.raises(RuntimeError, match="unjoined"):
        with dev.stream(main):
            with dev.graph():
                side.wait_stream(main)
                with dev.stream(side):
                    dev.kernel(1.0)


def test_elapsed_ms_of_a_cross_stream_pair_waits_for_both():
    dev = FakeDevice()
    clock = CudaEventClock(event_factory=lambda: dev.Event(enable_timing=True))
    s1, s2 = dev.Stream(), dev.Stream()
    with dev.stream(s1):
        dev.kernel(5.0)
        a = clock.mark()  # start on s1, behind a long kernel
    with dev.stream(s2):
        b = clock.mark()  # end on s2, which has nothing before it
    dev.advance(b)
    assert b.query() and not a.query()
    assert clock.elapsed_ms(a, b) is None  # not an exception that would turn profiling off
    dev.run()
    assert clock.elapsed_ms(a, b) is not None


def test_thread_clock_leaves_out_time_the_thread_does_not_run():
    """``cpu_clock("thread")`` reads the thread's own CPU time: a sleep (the OS running something else)
    is left out, the wall clock counts it; both read a busy-wait."""
    wall, thread = cpu_clock(names.CLOCK_WALL), cpu_clock(names.CLOCK_THREAD)
    assert (wall.mode, thread.mode) == (names.TIMING_CPU, names.TIMING_CPU_THREAD)
    w0, t0 = wall.mark(), thread.mark()
    time.sleep(0.05)
    w1, t1 = wall.mark(), thread.mark()
    assert wall.elapsed_ms(w0, w1) >= 50.0 and thread.elapsed_ms(t0, t1) < 0.5 * wall.elapsed_ms(w0, w1)
    t0 = thread.mark()
    end = time.thread_time_ns() + 20_000_000
    while time.thread_time_ns() < end:
        pass
    assert thread.elapsed_ms(t0, thread.mark()) >= 20.0


def test_clock_choice_by_name_and_device():
    assert make_clock("cpu", names.CLOCK_THREAD).mode == names.TIMING_CPU_THREAD
    assert make_clock(None).mode == names.TIMING_CPU and type(make_clock("cpu")) is CpuClock
    with pytest.raises(ValueError, match="unknown clock 'cpu'"):
        cpu_clock("cpu")
    assert CtxProfConfig().clock == names.CLOCK_WALL
    assert CtxProfConfig.from_env({names.ENV_CLOCK: "Thread"}).clock == names.CLOCK_THREAD
    with pytest.raises(ValueError, match=names.ENV_CLOCK):
        CtxProfConfig.from_env({names.ENV_CLOCK: "cpu"})


def _run_steps(p, n=3):
    cap = Capture(p)
    s = Sched()
    for _ in range(n):
        b = Batch([Req("a", 50)])
        s.process_batch_result(b, s.run_batch(b))
    return cap.records()


def test_thread_clock_profile_labels_its_records_and_its_leaves_sum_to_the_step():
    session = CtxProfSession(CtxProfConfig(clock=names.CLOCK_THREAD), targets=TARGETS)
    assert set(session.instrument().values()) == {"ok"}
    p = session.profiler
    try:
        recs = _run_steps(p)
        status = p.status()
    finally:
        session.uninstrument()
    assert len(recs) == 3 and all(r.timing == names.TIMING_CPU_THREAD for r in recs)
    assert status["timing"] == names.TIMING_CPU_THREAD and status["clock"] == names.CLOCK_THREAD
    for r in recs:  # every phase on the one clock: the leaves add up to the step
        assert r.step_ms > 0 and r.leaf_sum_ms() == pytest.approx(r.step_ms, rel=1e-9, abs=1e-9)
        assert set(r.phases_ms) >= {"draft", "verify_attn", "verify_moe", "draft_extend", "overhead"}


def test_reset_switches_the_clock_between_steps_and_refuses_a_bad_one():
    session = CtxProfSession(CtxProfConfig(), targets=TARGETS, clock=CpuClock(lambda: NOW[0]))
    session.instrument()
    p = session.profiler
    try:
        assert _run_steps(p, 1)[0].timing == names.TIMING_CPU and p.status()["clock"] == names.CLOCK_WALL
        with pytest.raises(ValueError, match="unknown clock"):
            p.reset("gpu")
        assert p.clock_name == names.CLOCK_WALL  # a bad name changes nothing
        p.reset(names.CLOCK_THREAD)
        assert p.clock.mode == names.TIMING_CPU_THREAD and p.status()["clock"] == names.CLOCK_THREAD
        assert p.state()["state"]["records"] == 0
        recs = _run_steps(p, 2)
        assert [r.timing for r in recs] == [names.TIMING_CPU_THREAD] * 2
        assert all(r.leaf_sum_ms() == pytest.approx(r.step_ms, rel=1e-9, abs=1e-9) for r in recs)
        p.reset(names.CLOCK_WALL)
        assert p.clock.mode == names.TIMING_CPU and p.state()["state"]["records"] == 0
    finally:
        session.uninstrument()


def test_reset_clock_is_refused_on_a_device_clock():
    dev = FakeDevice()
    session = CtxProfSession(CtxProfConfig(), targets=[], clock=CudaEventClock(lambda: dev.Event(enable_timing=True)))
    session.instrument()
    p = session.profiler
    with pytest.raises(ValueError, match="for CPU servers"):
        p.reset(names.CLOCK_THREAD)
    assert p.clock_name == names.CLOCK_WALL and p.status()["clock"] is None
    p.reset(names.CLOCK_WALL)  # the same name: a plain reset
    session.uninstrument()
