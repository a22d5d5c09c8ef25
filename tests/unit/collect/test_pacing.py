"""collect/pacing: the drain thread works in bounded slices and hands the GIL over between them, and
looks for work at the pace of the steps.
A fake clock that each item advances by its cost: no timing thresholds."""

from __future__ import annotations

import threading
from collections import deque

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect.pacing import Pacer
from sglang_ctxprof.collect.recorder import Recorder
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord


class World:
    """A clock in ns that consuming an item advances by that item's cost; a log of what happened."""

    def __init__(self) -> None:
        self.now = 0
        self.log: list[object] = []

    def clock(self) -> int:
        return self.now

    def sleep(self, s: float) -> None:
        self.log.append(("pause", s))

    def consume(self, item: tuple[int, int]) -> None:
        i, cost_ns = item
        self.now += cost_ns
        self.log.append(i)


def _pacer(w: World, **kw) -> Pacer:
    return Pacer(clock=w.clock, sleep=w.sleep, **kw)


def test_a_slice_ends_once_its_budget_is_spent_and_the_drain_pauses_before_the_next():
    w = World()
    q = deque((i, 60_000) for i in range(10))  # 60 µs each against a 200 µs slice
    p = _pacer(w, slice_ns=200_000, pause_s=50e-6)
    assert p.drain(q, w.consume, threading.Lock()) == 10 and not q
    pause = ("pause", 50e-6)
    assert w.log == [0, 1, 2, 3, pause, 4, 5, 6, 7, pause, 8, 9]  # 4 items reach 240 µs >= 200
    assert (p.slices, p.pauses) == (3, 2)  # no pause after the slice that emptied the queue


def test_a_slice_is_a_share_of_the_step_within_its_bounds():
    """``fit``: half a percent of the step, never under the shortest slice nor over the longest; a
    pacer whose shortest slice is unbounded (a whole-queue drain) stays whole."""
    from sglang_ctxprof.collect.pacing import SLICE_MAX_NS, SLICE_NS, SLICE_SHARE

    p = Pacer()
    assert p.current_ns == SLICE_NS
    p.fit(20e6)  # a 20 ms step
    assert p.current_ns == int(20e6 * SLICE_SHARE) == 100_000
    p.fit(6.5e6)  # a CPU-bound step of a few ms: the shortest slice
    assert p.current_ns == SLICE_NS
    p.fit(2e9)  # a long prefill's worth: the longest
    assert p.current_ns == SLICE_MAX_NS
    p.fit(0)  # unknown
    assert p.current_ns == SLICE_NS
    whole = Pacer(slice_ns=2**62, pause_s=0.0)
    whole.fit(20e6)
    assert whole.current_ns == 2**62
    w = World()  # and a slice runs as long as fitted
    q = deque((i, 30_000) for i in range(10))
    fitted = _pacer(w, slice_ns=50_000)
    fitted.fit(24e6)  # 120 µs slices: four 30 µs items each
    fitted.drain(q, w.consume, threading.Lock())
    pause = ("pause", fitted.pause_s)
    assert w.log == [0, 1, 2, 3, pause, 4, 5, 6, 7, pause, 8, 9]


def test_an_item_longer_than_the_slice_is_a_slice_of_its_own_and_nothing_is_split_or_skipped():
    w = World()
    q = deque([(0, 1_000_000), (1, 10_000), (2, 5_000_000), (3, 10_000)])
    p = _pacer(w, slice_ns=200_000)
    p.drain(q, w.consume, threading.Lock())
    pause = ("pause", p.pause_s)
    assert w.log == [0, pause, 1, 2, pause, 3]  # a hand-over after each slice that a long item ended


def test_a_backlog_drains_without_pauses_until_it_is_back_under_the_limit():
    w = World()
    q = deque((i, 100_000) for i in range(12))
    p = _pacer(w, slice_ns=200_000, backlog=6)
    p.drain(q, w.consume, threading.Lock())
    assert [x for x in w.log if isinstance(x, int)] == list(range(12))
    # slices of 2: 10 left, 8 left (no pause: > 6), 6 left (pause), 4 (pause), 2 (pause), 0
    assert p.pauses == 3 and p.slices == 6
    assert w.log.index(("pause", p.pause_s)) == 6  # first pause once only 6 wait


def test_items_queued_while_draining_are_consumed_in_order_and_stop_ends_the_drain():
    w = World()
    q: deque = deque([(0, 300_000)])
    more = iter([(1, 300_000), (2, 300_000), (3, 300_000)])

    def consume(item):
        w.consume(item)
        nxt = next(more, None)
        if nxt is not None:
            q.append(nxt)  # the scheduler thread submits while the drain runs

    p = _pacer(w, slice_ns=200_000)
    n = p.drain(q, consume, threading.Lock(), stop=lambda: len([x for x in w.log if isinstance(x, int)]) >= 3)
    assert n == 3 and [x for x in w.log if isinstance(x, int)] == [0, 1, 2] and list(q) == [(3, 300_000)]
    assert p.drain(q, consume, threading.Lock()) == 1 and not q


def test_the_lock_is_free_during_each_pause_so_a_reader_can_flush_in_between():
    w = World()
    lock = threading.Lock()
    held: list[bool] = []

    def sleep(s):
        held.append(lock.locked())

    q = deque((i, 150_000) for i in range(6))
    Pacer(slice_ns=200_000, clock=w.clock, sleep=sleep).drain(q, w.consume, lock)
    assert held == [False, False]  # two pauses (after items 1 and 3), the lock free in both


def _rec(i: int) -> StepRecord:
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(f"r{i}",),
                      ctx_lens=(100,), accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4,
                      step_ms=1.0, phases_ms={"draft": 0.5, "verify": 0.5}, t_start_ns=10**18 + i)


class Sink:
    name = "logs"

    def __init__(self) -> None:
        self.got: list[int] = []

    def observe(self, rec: StepRecord) -> None:
        self.got.append(rec.step_id)

    def stop(self) -> None:
        pass


def test_the_recorders_drain_thread_paces_and_a_reader_flushing_meanwhile_keeps_order_and_counts():
    """The drain thread drains the aggregator through its pacer; a reader between two slices catches
    the aggregator up at once.  Every record is observed exactly once, in order, by the aggregator and by the sink."""
    agg, sink = Aggregator(), Sink()
    paused = threading.Event()
    go = threading.Event()

    def sleep(s):  # the drain thread's first hand-over: let the test read, then go on
        paused.set()
        go.wait(10)

    ticks = iter(range(0, 10**12, 150_000))
    pacer = Pacer(slice_ns=200_000, clock=lambda: next(ticks), sleep=sleep)
    r = Recorder(agg, Guard(), sinks=[sink], pacer=pacer)
    for i in range(40):
        r.submit(_rec(i))
    r.start()
    assert paused.wait(10)  # the drain thread took a slice and is handing the GIL over
    assert 0 < agg.records < 40  # a slice, not the whole queue
    assert sink.got == []  # the sinks are fed once the aggregator has caught up, outside its lock
    assert r.with_aggregator(lambda a: a.records) == 40  # the reader's flush takes the rest at once
    go.set()
    r.close()
    assert sink.got == list(range(40)) and agg.records == 40 and pacer.pauses >= 1


def _looks_at_pace(looks, step_s: float, records: int = 400) -> tuple[float, int, float]:
    """Run ``looks`` on a simulated clock against one record every ``step_s`` (a pass takes no
    time): (wake-ups per record, the most records one look found, the longest a record waited)."""
    t, arrival, waiting, wakes, got, most, longest = 0.0, 0.0, [], 0, 0, 0, 0.0
    while got < records:
        while arrival <= t:
            waiting.append(arrival)
            arrival += step_s
        if waiting:
            looks.found(len(waiting))
            got, most = got + len(waiting), max(most, len(waiting))
            longest = max(longest, t - waiting[0])
            waiting = []
        else:
            t += looks.sleep()
            wakes += 1
    return wakes / got, most, longest


def test_an_idle_drain_thread_sleeps_longer_each_look_that_finds_nothing():
    """With nothing to do, each look that finds nothing doubles the sleep up to ``POLL_MAX_S``."""
    from sglang_ctxprof.collect.pacing import POLL_MAX_S, POLL_S, Looks

    looks = Looks()
    assert [looks.sleep() for _ in range(7)] == [POLL_S * 2**k for k in range(5)] + [POLL_MAX_S] * 2
    small = Looks(0.01, 0.02, 0.03)
    assert [small.sleep() for _ in range(4)] == [0.01, 0.02, 0.03, 0.03]


def test_the_drain_looks_at_the_pace_of_the_steps():
    """Records at a steady pace: the first sleep after a pass follows it, so a look finds about one
    record, or a few, and a record waits at most ``POLL_BUSY_MAX_S`` and a look's miss.  One step
    every 20 ms (a GPU decode, a CPU server at concurrency 1): about one wake-up per record, where
    a fixed 5 ms first sleep (5, 10, 20 ms: looks that mostly find nothing) woke twice."""
    from sglang_ctxprof.collect.pacing import MANY, POLL_BUSY_MAX_S, POLL_MAX_S, POLL_S, Looks

    for step_s in (0.001, 0.0065, 0.02, 0.06, 0.2):
        per_record, most, longest = _looks_at_pace(Looks(), step_s)
        if step_s <= POLL_BUSY_MAX_S:
            assert per_record <= 1.05, (step_s, per_record)  # once, after the first few
            assert longest <= POLL_BUSY_MAX_S + step_s, (step_s, longest)
        if step_s >= POLL_S:
            assert most <= MANY, (step_s, most)
        else:  # faster than the shortest sleep: a few per look, never a pile
            assert most <= POLL_S / step_s + 1, (step_s, most)
    # slower steps: a look every POLL_MAX_S at most while the server waits for the next step
    assert _looks_at_pace(Looks(), 0.2)[0] <= 0.2 / POLL_BUSY_MAX_S + 1
    # a fixed first sleep, as before (halving and doubling switched off): more wake-ups per record
    fixed = Looks(busy_most=POLL_S, many=10**9)
    assert _looks_at_pace(fixed, 0.02)[0] >= 1.5 > _looks_at_pace(Looks(), 0.02)[0]
    # back to a fast pace after a slow one: the first sleep comes down again
    looks = Looks()
    _looks_at_pace(looks, 0.06)
    assert looks.first == POLL_BUSY_MAX_S
    assert _looks_at_pace(looks, 0.0065)[1] <= 2 * MANY and looks.first <= 2 * 0.0065 * MANY
    assert POLL_MAX_S >= POLL_BUSY_MAX_S >= POLL_S


def test_on_a_cpu_device_the_drain_takes_what_it_finds_in_one_go_and_looks_less_often():
    """``for_device``: an accelerator's drain is paced (slices fitted to the step, a hand-over between
    two, looks at the steps' pace); a CPU device's takes the whole queue without a hand-over (its
    working set is cold at every look and after every pause) and looks every ``CPU_LOOK_S`` at least."""
    from sglang_ctxprof.collect.pacing import CPU_LOOK_S, POLL_S, Looks, for_device

    for device in ("cuda", "npu"):
        pacer, looks = for_device(device)
        assert (pacer.slice_ns, pacer.current_ns, looks.base) == (Pacer().slice_ns, Pacer().current_ns, POLL_S)
    pacer, looks = for_device("cpu")
    w = World()
    pacer.clock, pacer.sleep = w.clock, w.sleep
    pacer.fit(20e6)
    q = deque((i, 60_000) for i in range(40))  # 2.4 ms of work: twelve paced slices
    assert pacer.drain(q, w.consume, threading.Lock()) == 40
    assert w.log == list(range(40)) and (pacer.slices, pacer.pauses) == (1, 0)
    q = deque((i, 60_000) for i in range(200))  # a backlog of 12 ms: slices without a pause, a stop seen between
    assert pacer.drain(q, w.consume, threading.Lock(), stop=lambda: pacer.slices >= 3) == 168  # two slices
    assert pacer.pauses == 0 and len(q) == 32
    assert looks.base == looks.first == looks.busy_most == CPU_LOOK_S > Looks().busy_most
    assert [looks.sleep() for _ in range(3)] == [CPU_LOOK_S, looks.most, looks.most]
    pacer, looks = for_device("cpu", prompt=True)  # a sink that must see each step at once
    assert pacer.pause_s == 0 and looks.base == POLL_S and looks.busy_most == Looks().busy_most


def test_the_recorder_is_paced_for_its_device_unless_given_a_pacer():
    from sglang_ctxprof.collect.pacing import CPU_LOOK_S, CPU_SLICE_NS

    r = Recorder(Aggregator(), Guard())
    r.fit_device("cpu")
    assert r.pacer.slice_ns == CPU_SLICE_NS and r.pacer.pause_s == 0 and r.looks.base == CPU_LOOK_S
    r.fit_device("cuda")
    assert r.pacer.slice_ns == Pacer().slice_ns and r.looks.base < CPU_LOOK_S
    given = Pacer(slice_ns=123_000)
    r = Recorder(Aggregator(), Guard(), pacer=given)
    r.fit_device("cpu")
    assert r.pacer is given and r.looks.base < CPU_LOOK_S


def test_a_running_drain_thread_takes_the_looks_fit_device_chose_at_its_next_look():
    from sglang_ctxprof.collect.pacing import Looks

    class Spy(Looks):
        def __init__(self):
            super().__init__(base=0.001, busy_most=0.001, most=0.001)
            self.seen = threading.Event()

        def sleep(self) -> float:
            self.seen.set()
            return super().sleep()

    r = Recorder(Aggregator(), Guard())
    r.start()
    try:
        spy = Spy()
        r.looks = spy  # as fit_device sets them, the thread already running
        assert spy.seen.wait(10)
    finally:
        r.close()
