"""The aggregator's one ring of recent steps (aggregate/recent.py): typed rows for every kept step,
the whole record only for the newest ``with_records``, memory bounded by both."""

from __future__ import annotations

from sglang_ctxprof.aggregate.recent import RecentStep, RecentSteps
from sglang_ctxprof.model.records import RankId, StepRecord


def _rec(i: int, t_end_ns: int = 0) -> StepRecord:
    return StepRecord(step_id=i, kind="decode" if i % 3 else "prefill", algorithm="EAGLE", rank=RankId(),
                      rids=("a",), ctx_lens=(10,), accepted=(1,), committed=(1,), finished=(False,),
                      draft_tokens=4, step_ms=1.25, t_start_ns=10**9 + i * 10**7, t_end_ns=t_end_ns)


def test_rows_are_typed_and_only_the_newest_keep_their_record():
    ring = RecentSteps(depth=10, with_records=3)
    recs = [_rec(i, t_end_ns=10**9 + i * 10**7 + 2 * 10**6 if i % 2 else 0) for i in range(25)]
    for r in recs:
        ring.add(r)
    rows = list(ring)
    assert len(ring) == 10 and all(isinstance(row, RecentStep) for row in rows)
    assert [row.step_id for row in rows] == list(range(15, 25))
    assert [row.t_end_ns for row in rows] == [r.host_end_ns for r in recs[15:]]
    assert [row.record is not None for row in rows] == [False] * 7 + [True] * 3
    assert ring.records() == recs[-3:] and ring.records(2) == recs[-2:] and ring.records(99) == recs[-3:]
    assert ring.records(0) == []


def test_fewer_steps_than_the_record_window():
    ring = RecentSteps(depth=10, with_records=3)
    ring.add(_rec(1))
    assert ring.records() == [_rec(1)] and list(ring)[0].record == _rec(1)


def _rows(ring, *a):
    rows, left = ring.json_rows(*a)
    assert left == 0
    return rows


def test_json_rows_write_each_record_once_and_equal_the_records(monkeypatch):
    import json

    ring = RecentSteps(depth=10, with_records=4)
    calls: list[int] = []
    real = StepRecord.to_dict
    monkeypatch.setattr(StepRecord, "to_dict", lambda self: calls.append(self.step_id) or real(self))
    for i in range(6):
        ring.add(_rec(i))
    assert list(map(json.loads, _rows(ring))) == [real(r) for r in ring.records()]
    assert calls == [2, 3, 4, 5]
    ring.add(_rec(6))
    assert [d["step_id"] for d in map(json.loads, _rows(ring, 4))] == [3, 4, 5, 6]
    assert calls == [2, 3, 4, 5, 6]  # a later read writes only the new step
    assert _rows(ring, 0) == [] and list(map(json.loads, _rows(ring, 2))) == [real(r) for r in ring.records(2)]


def test_a_read_writes_the_newest_steps_up_to_a_bound_on_their_request_rows():
    """A large batch's rows cost the scheduler thread ~1 us each: a read stops at ``max_rows`` request
    rows, newest steps first, and says how many older steps it left out; one step always comes."""
    import json
    from dataclasses import replace

    ring = RecentSteps(depth=10, with_records=8)
    for i in range(8):
        ring.add(replace(_rec(i), rids=tuple(f"r{k}" for k in range(3)), ctx_lens=(5,) * 3))
    rows, left = ring.json_rows(8, max_rows=7)
    assert [json.loads(r)["step_id"] for r in rows] == [6, 7] and left == 6
    rows, left = ring.json_rows(5, max_rows=1)
    assert [json.loads(r)["step_id"] for r in rows] == [7] and left == 4
    assert ring.json_rows(8, max_rows=24)[1] == 0
