"""collect/recorder: the hand-off from the hot path.  Every record reaches the aggregator and then
each sink in order; a failing sink is disabled alone; a full queue counts its drops; a read
flushes first; close stops every sink."""

from __future__ import annotations

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect.recorder import Recorder
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
    """A step's host facts: the record is built on the drain thread (``record()``)."""

    def __init__(self, i: int, fail: bool = False) -> None:
        self.i, self.fail = i, fail

    def record(self) -> StepRecord:
        if self.fail:
            raise ValueError("bad host facts")
        return _rec(self.i)


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
    assert good.seen_by_aggregator == [1, 2, 3, 4]  # the aggregator takes each record first


def test_a_full_queue_counts_drops_and_never_blocks():
    r, agg, _, _ = _recorder(maxsize=2)
    for i in range(5):
        r.submit(_rec(i))
    assert (r.submitted, r.dropped, r.dropped_count()) == (2, 3, 3)
    r.flush()
    assert agg.records == 2
    r.submit(_rec(9))  # room again after the drain
    assert r.submitted == 3 and r.dropped == 3


def test_a_read_flushes_first():
    r, _, _, (sink,) = _recorder(("logs", -1))
    for i in range(3):
        r.submit(_rec(i))
    assert r.with_aggregator(lambda a: a.records) == 3 and sink.got == [0, 1, 2]


def test_host_facts_are_built_on_the_drain_and_a_bad_one_disables_the_recorder():
    r, agg, guard, (sink,) = _recorder(("logs", -1))
    r.submit(Host(0))
    r.flush()
    assert agg.records == 1 and sink.got == [0]
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
