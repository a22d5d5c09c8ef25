"""collect/recorder: the hand-off from the hot path.  Every record reaches the aggregator and then
each sink in order; a failing sink is disabled alone; a full queue counts its drops; a read
catches the aggregator up first but runs no sink, and a stalled sink blocks no read; close stops
every sink."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect.recorder import Recorder
from sglang_ctxprof.model.facts import CARRIED, StepFacts
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord


def _rec(i: int) -> StepRecord:
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(f"r{i}",),
                      ctx_lens=(100,), accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4,
                      step_ms=1.0, phases_ms={"draft": 0.5, "verify": 0.5}, t_start_ns=10**18 + i)


class Sink:
    """A record sink that keeps what it saw (and, as ``seen_by_aggregator``, what the aggregator had)."""

    def __init__(self, name: str, agg: Aggregator, fail_at: int = -1) -> None:
        self.name, self.agg, self.fail_at = name, agg, fail_at
        self.got: list[int] = []
        self.seen_by_aggregator: list[int] = []
        self.stopped = 0

    def observe(self, rec: StepRecord) -> None:
        self.seen_by_aggregator.append(self.agg.records)
        if rec.step_id == self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.got.append(rec.step_id)

    def stop(self) -> None:
        self.stopped += 1


class Host:
    """A step's host facts, as ``host.HostFacts``: the drain thread builds them in stages (``build``:
    the ids read, this object coming back; then a real ``StepFacts``, whose own two stages build the
    record)."""

    def __init__(self, i: int, fail: bool = False) -> None:
        self.i, self.fail, self.read = i, fail, False

    def build(self):
        if self.fail:
            raise ValueError("bad host facts")
        if not self.read:
            self.read = True
            return self
        r = _rec(self.i)
        return StepFacts(r.rids, (90,), True, [10], [0], [12], [1], [False], [2], None, (),
                         **{n: getattr(r, n) for n in CARRIED})


def _recorder(*sinks_spec, maxsize=65536):
    agg, guard = Aggregator(), Guard()
    sinks = [Sink(name, agg, fail_at) for name, fail_at in sinks_spec]
    return Recorder(agg, guard, maxsize=maxsize, sinks=sinks), agg, guard, sinks


def test_a_failing_sink_is_disabled_alone_and_the_others_get_every_record():
    r, agg, guard, (bad, good) = _recorder(("exporter", 1), ("metrics", -1))
    for i in range(4):
        r.submit(_rec(i))
    r.flush()
    assert agg.records == 4 and good.got == [0, 1, 2, 3]
    assert bad.got == [0] and len(bad.seen_by_aggregator) == 2  # failed on record 1, then skipped
    assert set(guard.status()["components"]) == {"exporter"}
    assert good.seen_by_aggregator == [4, 4, 4, 4]  # the aggregator takes what waits first


def test_a_full_queue_counts_drops_and_never_blocks():
    r, agg, _, _ = _recorder(maxsize=2)
    for i in range(5):
        r.submit(_rec(i))
    assert (r.submitted, r.dropped, r.dropped_count()) == (2, 3, 3)
    r.flush()
    assert agg.records == 2
    r.submit(_rec(9))  # room again after the drain
    assert r.submitted == 3 and r.dropped == 3


def test_a_read_catches_the_aggregator_up_and_leaves_the_sinks_to_the_drain():
    r, _, _, (sink,) = _recorder(("logs", -1))
    for i in range(3):
        r.submit(_rec(i))
    assert r.with_aggregator(lambda a: a.records) == 3 and sink.got == []  # no sink on the reader's thread
    r.submit(_rec(3))
    r.flush()
    assert sink.got == [0, 1, 2, 3] and sink.seen_by_aggregator == [4, 4, 4, 4]


class Blocking(Sink):
    """A sink whose first ``observe`` waits until ``release`` is set (a stalled log pipe or exporter)."""

    def __init__(self, agg: Aggregator) -> None:
        super().__init__("logs", agg)
        self.entered, self.release = threading.Event(), threading.Event()
        self.threads: set[str] = set()

    def observe(self, rec: StepRecord) -> None:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.release.wait()
        super().observe(rec)


def _stuck(maxsize: int = 65536) -> tuple[Recorder, Aggregator, "Blocking"]:
    """A running recorder whose drain thread is stuck inside a sink's ``observe`` of record 0."""
    agg = Aggregator()
    sink = Blocking(agg)
    r = Recorder(agg, Guard(), maxsize=maxsize, sinks=[sink])
    r.start()
    r.submit(_rec(0))
    assert sink.entered.wait(60)
    return r, agg, sink


def _wait(cond, what: str, limit_s: float = 60.0) -> None:
    """Liveness only (a hang would otherwise hang the suite), never a timing threshold."""
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.005)


def _read(r: Recorder) -> int:
    """``with_aggregator`` from another thread (as the scheduler's control handler would); a read
    that blocks fails the test instead of hanging it."""
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(r.with_aggregator(lambda a: a.records)), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "the read blocked"
    return got[0]


def test_a_stalled_sink_blocks_no_read_and_later_gets_every_record_once_in_order():
    r, agg, sink = _stuck()  # the drain thread is now stuck inside the sink
    try:
        for i in range(1, 50):
            r.submit(_rec(i))
        assert _read(r) == 50  # answered while the sink was still blocked
        assert not sink.release.is_set() and sink.got == []
        for i in range(50, 60):  # more steps after the read, some drained by a second read
            r.submit(_rec(i))
        assert _read(r) == 60
        sink.release.set()
        _wait(lambda: len(sink.got) == 60, "the sink caught up")
    finally:
        sink.release.set()
        r.close()
    assert sink.got == list(range(60)) and sink.threads == {"ctxprof-recorder"}
    assert r.sink_dropped == 0 and agg.records == 60


def test_the_drain_thread_feeds_the_sinks_what_a_read_aggregated_with_no_further_step():
    r, agg, _, (sink,) = _recorder(("logs", -1))
    r.start()
    try:
        for i in range(5):
            r.submit(_rec(i))
        assert r.with_aggregator(lambda a: a.records) == 5
        _wait(lambda: sink.got == [0, 1, 2, 3, 4], "the sinks got what the read aggregated")
    finally:
        r.close()


def test_a_stalled_sink_backlog_is_bounded_and_counted():
    r, agg, sink = _stuck(maxsize=4)
    try:
        for k in range(3):  # reads keep the aggregator current; the sinks' backlog stays bounded
            for i in range(4):
                r.submit(_rec(1 + 4 * k + i))
            _read(r)
        assert agg.records == 13 and r.dropped == 0 and r.sink_dropped == 8
    finally:
        sink.release.set()
        r.close()
    assert sink.got == [0, 1, 2, 3, 4]


def test_host_facts_are_built_on_the_drain_and_a_bad_one_disables_the_recorder():
    r, agg, guard, (sink,) = _recorder(("logs", -1))
    r.submit(Host(0))
    r.flush()
    assert agg.records == 1 and sink.got == [0]
    assert agg.recent[-1] == _rec(0)  # built in two stages: the plain facts, then the record
    r.submit(Host(1, fail=True))
    r.flush()
    assert "recorder" in guard.status()["components"] and agg.records == 1
    r.submit(_rec(2))  # a disabled recorder takes nothing more
    assert r.submitted == 2


def test_the_drain_thread_delivers_and_close_stops_every_sink_even_a_disabled_one():
    r, agg, guard, (bad, good) = _recorder(("exporter", 0), ("metrics", -1))
    r.start()
    for i in range(3):
        r.submit(_rec(i))
    r.close()
    assert agg.records == 3 and good.got == [0, 1, 2]
    assert not guard.ok("exporter") and bad.stopped == good.stopped == 1
    assert r._thread is None


def test_a_request_end_reaches_the_aggregator_then_only_the_sinks_that_end_requests_in_order():
    from sglang_ctxprof.model.records import RequestEnd

    class Ends(Sink):
        def __init__(self, *a) -> None:
            super().__init__(*a)
            self.order: list = []

        def observe(self, rec: StepRecord) -> None:
            super().observe(rec)
            self.order.append(rec.step_id)

        def end(self, end: RequestEnd) -> None:
            self.order.append((end.rid, end.kind, self.agg.snapshot().requests_aborted))

    agg, guard = Aggregator(), Guard()
    plain, ends = Sink("capture", agg), Ends("exporter", agg)
    r = Recorder(agg, guard, sinks=[plain, ends])
    r.submit(_rec(0))
    r.submit(RequestEnd("r0", retracted=True))
    r.submit(_rec(1))
    r.submit(RequestEnd("gone"))
    r.flush()
    assert plain.got == [0, 1] and guard.status() is None  # a sink without ``end`` is passed over
    assert ends.order == [0, ("r0", "retracted", 2), 1, ("gone", "queued", 2)]
    assert agg.request("r0")["aborted"] == "retracted" and r.cost.drain_records == 2


def _big(i: int, n: int) -> StepRecord:
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(),
                      rids=tuple(f"r{i}-{k}" for k in range(n)), ctx_lens=(100,) * n, accepted=(2,) * n,
                      committed=(2,) * n, finished=(False,) * n, draft_tokens=4, step_ms=1.0,
                      phases_ms={"draft": 0.5, "verify": 0.5}, t_start_ns=10**18 + i)


def test_a_large_record_is_taken_in_stages_and_a_read_between_two_finishes_it_first():
    """A slice that ends within a record leaves its rest first in the queue: the next slice, or a
    read's catch-up, finishes it before the next record; nothing is lost or reordered."""
    from sglang_ctxprof.aggregate.requests import CHUNK
    from sglang_ctxprof.collect.pacing import Pacer

    agg, sink = Aggregator(), Sink("logs", Aggregator())
    r = Recorder(agg, Guard(), sinks=[sink], pacer=Pacer(slice_ns=0, sleep=lambda s: None))
    n = 4 * CHUNK
    r.submit(Host(0))  # built on the drain thread: four stages of their own
    r.submit(_big(1, n))
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's ids
    assert type(r._q[0]) is Host and r._q[0].read and agg.records == 0
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's plain facts
    assert type(r._q[0]) is StepFacts and r._q[0].columns is None
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's columns
    assert type(r._q[0]) is StepFacts and r._q[0].columns is not None and agg.records == 0
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0 built
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's bucket counts
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's acceptance counts
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's phase folds
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0's request, then its audit waits
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 0 done
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 1's bucket counts
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 1's acceptance counts
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 1's phase folds
    r.pacer.run_slice(r._q, r._consume, r._lock)  # record 1's first chunk of requests
    assert agg.records == 2 and len(agg.requests) == 1 + CHUNK  # record 1 taken in part
    assert len(r._q) == 1  # its rest, first in line
    assert r.with_aggregator(lambda a: len(a.requests)) == 1 + n  # a read finishes it
    r.flush()
    assert sink.got == [0, 1] and agg.audit.checked["steps"] == 2
    assert r.cost.drain_records == 2


def test_the_drain_thread_feeds_the_sinks_in_slices():
    """The sinks are fed outside the aggregator's lock in the pacer's slices, with a hand-over of
    the GIL between two, as the aggregator is."""
    from sglang_ctxprof.collect.pacing import Pacer

    agg = Aggregator()
    seen_at_pause: list[int] = []
    sink = Sink("logs", agg)
    r = Recorder(agg, Guard(), sinks=[sink],
                 pacer=Pacer(slice_ns=0, sleep=lambda s: seen_at_pause.append(len(sink.got))))
    for i in range(3):
        r.submit(_rec(i))
    with r._lock:
        r._catch_up()  # the aggregator has them all; the sinks not yet
    assert sink.got == []
    r._feed_sinks()
    assert sink.got == [0, 1, 2] and seen_at_pause == [1, 2]  # one record per slice, a pause between


def test_each_sinks_turn_is_a_piece_of_its_own_and_every_sink_sees_the_records_in_order():
    """A slice ends after one sink's turn: the record's later sinks wait first in line (a read in
    between runs no sink), and a flush finishes it without feeding any sink twice."""
    from sglang_ctxprof.collect.pacing import Pacer

    agg = Aggregator()
    order: list[tuple[str, int]] = []

    class Logged(Sink):
        def observe(self, rec: StepRecord) -> None:
            super().observe(rec)
            order.append((self.name, rec.step_id))

    a, b, c = Logged("capture", agg), Logged("exporter", agg), Logged("logs", agg)
    pauses: list[int] = []
    r = Recorder(agg, Guard(), sinks=[a, b, c], pacer=Pacer(slice_ns=0, sleep=lambda s: pauses.append(len(order))))
    for i in range(2):
        r.submit(_rec(i))
    r.with_aggregator(lambda _: None)  # aggregated; no sink has run
    assert order == []
    r.pacer.run_slice(r._fan, r._feed_one, r._sink_lock)
    assert order == [("capture", 0)] and len(r._fan) == 2  # record 0's other sinks first in line
    assert r.with_aggregator(lambda x: x.records) == 2 and len(order) == 1
    r._feed_sinks()
    assert order == [(s, i) for i in (0, 1) for s in ("capture", "exporter", "logs")]
    assert pauses == [2, 3, 4, 5]  # a hand-over of the GIL after each sink's turn that left one waiting
    r.submit(_rec(2))
    r.with_aggregator(lambda _: None)
    r.pacer.run_slice(r._fan, r._feed_one, r._sink_lock)
    r.flush()
    assert order[6:] == [("capture", 2), ("exporter", 2), ("logs", 2)]
    assert a.got == b.got == c.got == [0, 1, 2]


def test_a_drain_thread_told_to_stop_stays_stopped_even_when_its_stop_timed_out():
    """A drain pass slower than ``stop``'s join (here: its pause between two slices waits on an
    Event) leaves the old thread running past ``stop``; once that pass ends it must end too, and
    never consume what is submitted after a new ``start`` (two drain threads on one queue)."""
    from sglang_ctxprof.collect.pacing import Pacer

    entered, release = threading.Event(), threading.Event()

    def sleep(s: float) -> None:  # the first pause of a pass blocks until released: a slow drain pass
        if not entered.is_set():
            entered.set()
            release.wait()
        time.sleep(s)

    agg = Aggregator()
    drained_by: list[int] = []

    class ByThread(Sink):
        def observe(self, rec: StepRecord) -> None:
            drained_by.append(threading.get_ident())
            super().observe(rec)

    sink = ByThread("logs", agg)
    r = Recorder(agg, Guard(), sinks=[sink], pacer=Pacer(slice_ns=0, sleep=sleep))
    r.submit(_rec(0))
    r.submit(_rec(1))  # one slice takes record 0, then the pause blocks with record 1 waiting
    r.start()
    old = r._thread
    try:
        assert old is not None and entered.wait(60)
        r.stop(timeout=0.001)  # the join times out: the old thread is still inside its pass
        assert old.is_alive() and agg.records == 2  # stop's own flush took what was left
        drained_by.clear()
        r.start()
        new = r._thread
        assert new is not None and new is not old
        release.set()
        old.join(30)  # liveness only: an old thread that kept running fails here
        assert not old.is_alive(), "the stopped drain thread kept running"
        for i in range(2, 6):
            r.submit(_rec(i))
        _wait(lambda: sink.got[-4:] == [2, 3, 4, 5], "the new drain thread took the new records")
        assert set(drained_by) == {new.ident}
    finally:
        release.set()
        r.close()
    assert agg.records == 6


def test_the_drain_threads_waits_follow_that_schedule_and_count_in_its_cost():
    """A real drain thread with nothing to do: the sleeps it asks for (its stop event's ``wait``) go
    up as ``Looks`` says, a record brings them back down to the first sleep, and the CPU of its
    wake-ups is in the drain's cost (a server with nothing to record costs what its wakes cost, not
    nothing), as is their count."""
    asked: list[float] = []
    seen: list[int] = []  # the records the aggregator held at each wait
    r, agg, _, _ = _recorder()
    r.start()
    stop = r._stop
    assert stop is not None
    real = stop.wait
    enough = threading.Event()

    def wait(timeout=None):
        asked.append(timeout)
        seen.append(agg.records)
        if len(asked) >= 4:
            enough.set()
        return real(min(timeout, 0.001))  # the same schedule, run faster

    stop.wait = wait
    try:
        assert enough.wait(60)
        r.submit(_rec(0))
        deadline = time.monotonic() + 60
        while agg.records < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        n = len(asked)
        while len(asked) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        r.stop()
    first = asked[:4]
    assert first[0] in {min(0.005 * 2**k, 0.1) for k in range(6)}  # the thread began before the spy
    assert all(b == min(2 * a, 0.1) for a, b in zip(first, first[1:]))
    assert asked[seen.index(1)] == r.looks.first  # the wait after the record's pass: the first sleep
    assert r.looks.first < max(first)
    assert r.cost.drain_ns > 0 and r.cost.drain_records == 1
    assert r.cost.to_dict()["drain_wakes_per_record"] == r.cost.wakes >= len(asked) - 1


def test_the_drain_sizes_its_slices_to_the_recent_decode_step():
    """The drain thread's slices follow the decode steps it drains (a share of their recent mean);
    a prefill's long step moves nothing, nor does a step of unknown length (0)."""
    from dataclasses import replace

    from sglang_ctxprof.collect.pacing import SLICE_NS
    from sglang_ctxprof.collect.recorder import STEP_WEIGHT

    r, agg, _, _ = _recorder()
    for i in range(40):
        r.submit(replace(_rec(i), step_ms=20.0))
    r.submit(replace(_rec(40), kind="prefill", accepted=(0,), committed=(0,), draft_tokens=0, step_ms=900.0))
    r.submit(replace(_rec(41), step_ms=0.0))
    r.start()
    _wait(lambda: agg.records == 42, "the drain")
    r.submit(_rec(42))  # a pass after the 20 ms steps: its slices are fitted to them
    _wait(lambda: agg.records == 43, "the next pass")
    r.stop()
    assert r.step_ms == pytest.approx(20.0 + (1.0 - 20.0) * STEP_WEIGHT)  # _rec's own step: 1 ms
    assert r.pacer.current_ns == int(20.0e6 * r.pacer.share) > SLICE_NS


def _drain_threads() -> list[threading.Thread]:
    from sglang_ctxprof.collect.recorder import THREAD_NAME

    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def test_a_parked_drain_thread_finishes_the_queue_and_the_sinks_then_ends():
    """Profiling switched off at run time: the drain thread takes what was queued (aggregator, then
    every sink) and then ends, so an off profiler runs no thread; ``start`` brings one back."""
    r, agg, _, (sink,) = _recorder(("a", -1))
    r.start()
    thread = r._thread
    assert thread is not None and r.running()
    for i in range(50):
        r.submit(_rec(i))
    r.park()
    thread.join(60)
    assert not thread.is_alive() and not r.running() and r._thread is None
    assert agg.records == 50 and sink.got == list(range(50))
    r.submit(_rec(50))  # nothing drains it now (no hook submits while off; a read still would)
    r.start()
    _wait(lambda: sink.got[-1:] == [50], "the restarted drain")
    assert r.running() and r._thread is not thread
    r.stop()


def test_a_start_right_after_park_keeps_the_one_drain_thread():
    """``start`` while a parked thread has not ended yet un-parks that thread: one drain thread,
    never two, and it goes on draining."""
    r, agg, _, _ = _recorder()
    before = len(_drain_threads())
    r.start()
    thread = r._thread
    for _ in range(20):
        r.park()
        r.start()
    assert r._thread is thread and len(_drain_threads()) == before + 1
    r.submit(_rec(0))
    _wait(lambda: agg.records == 1, "the un-parked drain")
    assert thread.is_alive() and r.running()
    r.stop()
    assert not r.running()


def test_close_with_a_sink_stuck_for_good_returns_and_counts_what_it_never_saw():
    """A sink that never returns (a write to a pipe nobody reads) holds the drain thread; closing
    (``uninstrument``) waits a bounded time for it, then leaves its backlog, counted."""
    r, agg, sink = _stuck()
    try:
        for i in range(1, 5):
            r.submit(_rec(i))
        closer = threading.Thread(target=lambda: r.stop(timeout=0.2), daemon=True)
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "stop waited for the stuck sink"
        assert agg.records == 5 and r.sink_dropped == 4
    finally:
        sink.release.set()


def test_a_close_behind_a_stuck_sink_counts_records_never_marks_or_calls():
    """What the close leaves behind a stuck sink: its records are counted, a loss mark (its records
    counted when they were dropped) and a call after the sinks are not."""
    r, agg, sink = _stuck(maxsize=4)
    try:
        for batch in ((1, 2, 3, 4), (5, 6)):  # 1-4 wait for the sinks; 5, 6 find them full (one loss mark)
            for i in batch:
                r.submit(_rec(i))
            _read(r)
        assert r.sink_dropped == 2 and r.dropped == 0
        r.after_sinks(lambda: None)
        r.stop(timeout=0.2)
        assert agg.records == 7 and r.sink_dropped == 2 + 4
    finally:
        sink.release.set()


def _req(i: int, rid: str, kind: str = "decode", fin: bool = False, books=()) -> StepRecord:
    return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100 + i,),
                      accepted=(2,) if kind == "decode" else (0,), committed=(2,) if kind == "decode" else (0,),
                      finished=(fin,), draft_tokens=4 if kind == "decode" else 0, step_ms=1.0,
                      phases_ms={"draft": 0.5, "verify": 0.5} if kind == "decode" else {}, t_start_ns=10**18 + i,
                      books=books)


def test_a_step_lost_before_the_aggregator_leaves_the_requests_it_held_unchecked():
    """A decode step the profiler lost (the queue full, a step whose device times never came, one
    evicted while pending) is not in a running request's books: it is partial from then on, so the
    self-audit checks it against nothing, rather than blame SGLang's books.  A request that
    finished before the loss, or started after it, is checked as any other."""
    r, agg, _, _ = _recorder(maxsize=3)
    r.submit(_req(0, "a", "prefill"))
    r.submit(_req(1, "a"))
    r.submit(_req(2, "before", "prefill", fin=True, books=((-1, 1, 0),)))
    r.submit(_req(3, "a"))  # the queue is full: lost
    assert r.dropped == 1
    r.flush()
    r.submit(_req(4, "a", fin=True, books=((3, 7, 3),)))  # SGLang counted the 3 steps, 6 tokens
    r.submit(_req(5, "b", "prefill"))
    r.flush()
    r.lost()  # the profiler lost b's next step (its device times never came)
    r.submit(_req(7, "after", "prefill"))
    r.flush()
    r.submit(_req(8, "b", fin=True, books=((2, 5, 2),)))
    r.submit(_req(9, "after", fin=True, books=((1, 3, 1),)))
    r.flush()
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(st["violations"], 0), st["latest"]
    assert st["checked"]["requests"] == 2  # "before" and "after"; "a" and "b" missed steps


def test_a_lost_step_reaches_the_sinks_that_measure_between_steps_in_its_place():
    """A loss mark reaches each sink with a ``lost`` in queue order (the capture trigger then
    measures no host gap across it), and the aggregator's host gap too."""
    r, agg, _, (sink,) = _recorder(("s", -1))
    events = []
    sink.lost = lambda: events.append(("lost", list(sink.got)))
    r.submit(_rec(1))
    r.lost()
    r.submit(_rec(2))
    r.flush()
    assert sink.got == [1, 2] and events == [("lost", [1])]
    assert agg.host_gaps.count == 0


def test_records_the_sinks_miss_for_a_full_backlog_leave_a_loss_mark_in_their_place():
    r, agg, _, (sink,) = _recorder(("s", -1), maxsize=2)
    events = []
    sink.lost = lambda: events.append(("lost", list(sink.got)))
    for batch in ((1, 2), (3, 4)):  # read twice: the aggregator takes them, the sinks' backlog holds 2
        for i in batch:
            r.submit(_rec(i))
        r.with_aggregator(lambda a: None)
    r.flush()
    assert sink.got == [1, 2] and events == [("lost", [1, 2])] and r.sink_dropped == 2
    r.submit(_rec(5))
    r.flush()
    assert sink.got == [1, 2, 5]
