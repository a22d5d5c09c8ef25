"""The trace export written as text (views/trace_json): byte for byte the body of
``json_response(steps_trace(...))``, and each step row laid out once while it stays among those read.

Rows come from a real ``Aggregator`` ring (the scheduler's ``recent_steps_json``); hypothesis draws
phase times, start times and several ranks (out of order, prefill among them).
"""

from __future__ import annotations

import gc
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.records import RankId
from sglang_ctxprof.views.http_guard import json_response
from sglang_ctxprof.views.trace_events import steps_trace
from sglang_ctxprof.views.trace_json import TraceWriter
from record_fakes import LEAVES, trace_rec


def _reference(ranks, last):
    return json_response(steps_trace([(r, [json.loads(x) for x in rows]) for r, rows in ranks], last)).body.decode()


def _rows(n, start=0, t=1_000_000_007, rank=RankId()):
    agg = Aggregator()
    for i in range(start, start + n):
        agg.observe(trace_rec(i, t + i * 3_333_333, [0.5 + i % 3, 1.25, 2.0, 0.3, 0.7, 0.11], rank=rank,
                              kind="prefill" if i % 5 == 0 else "decode"))
    return agg.recent_steps_json(n)[0]


times = st.lists(st.floats(0.001, 40.0, allow_nan=False), min_size=len(LEAVES), max_size=len(LEAVES))
step = st.tuples(st.integers(0, 10**12), times, st.sampled_from(["decode", "prefill"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(step, max_size=5), min_size=0, max_size=3), st.integers(1, 2048))
def test_text_equals_the_dict_reply(ranks, last):
    data = []
    for k, steps in enumerate(ranks):
        rows = [json.dumps(trace_rec(i, t, ts, kind=kind).to_dict(), separators=(",", ":"))
                for i, (t, ts, kind) in enumerate(steps)]
        data.append((RankId(dp=k).to_dict(), rows))
    assert TraceWriter().render(data, last) == _reference(data, last)


def test_a_read_loop_lays_out_only_new_steps_and_shifts_ts():
    w = TraceWriter()
    first = _rows(6)
    assert w.render([({"dp": 0}, first)], 6) == _reference([({"dp": 0}, first)], 6)
    assert w.written == 6
    later = first[2:] + _rows(2, start=6)[-2:]  # the window moved on: t0 is now step 2's start
    text = w.render([({"dp": 0}, later)], 6)
    assert text == _reference([({"dp": 0}, later)], 6)
    assert w.written == 8  # the four steps still shown were not laid out again
    body = json.loads(text)
    assert min(e["ts"] for e in body["traceEvents"] if e.get("ph") == "X") == 0


def test_the_memo_keeps_only_the_last_read_and_tracks_are_apart():
    w = TraceWriter()
    a, b = _rows(3), _rows(3, rank=RankId(dp=1))
    two = [({"dp": 0}, a), ({"dp": 1}, b)]
    assert w.render(two, 3) == _reference(two, 3)
    assert w.written == 6
    swapped = [({"dp": 1}, b), ({"dp": 0}, a)]  # other tracks (tids): laid out anew, not mixed up
    assert w.render(swapped, 3) == _reference(swapped, 3)
    assert w.written == 12
    w.render([({"dp": 0}, [])], 3)
    assert len(w._memo) == 0  # bounded by the last read



def _tracked(obj) -> int:
    n = int(gc.is_tracked(obj))
    if isinstance(obj, (list, tuple)):
        n += sum(_tracked(v) for v in obj)
    return n


def test_the_memo_of_2048_steps_leaves_nothing_for_the_collector_to_walk():
    # SGLang's HTTP process keeps this memo for the life of the server: its entries must be atoms in
    # tuples (untracked by the GC once it has seen them), else every read's new steps add
    # containers to the oldest generation and bring on full collections of SGLang's heap.
    w = TraceWriter()
    rows = _rows(2048)
    for k in range(3):  # a read loop: the window moves on by 100 steps
        w.render([({"dp": 0}, rows[k * 100:] + _rows(k * 100, start=2048)[-k * 100:] if k else rows)], 2048)
    gc.collect()
    assert len(w._memo) == 2048
    assert sum(_tracked(key) + _tracked(entry) for key, entry in w._memo.items()) == 0


def test_the_steps_a_rank_left_out_are_counted_in_other_data():
    from sglang_ctxprof.views.http_trace import trace_reply

    rows = _rows(4)
    body = json.loads(trace_reply([{"status": {"rank": {"tp": 0}}, "steps_rows": rows, "steps_left_out": 7},
                                   {"status": {"rank": {"tp": 1}}, "steps_rows": rows, "steps_left_out": 2}], 16).body)
    assert body["otherData"]["steps_left_out"] == 9 and body["otherData"]["steps"] == 8
