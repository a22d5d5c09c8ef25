"""The Chrome trace export (views/trace_events) and the bounded ring behind it (aggregator.recent).

Records come from a real ``Aggregator``; hypothesis draws phase times (floats that rarely add up
exactly in binary) and the layout must still tile each step to the nanosecond.  The live check is
tests/server/test_ui.py (``/ctx_profile/trace.json`` and ``trace --perfetto`` on a CPU server).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.names import MAX_TRACE_STEPS
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.trace_events import request_trace, steps_trace
from record_fakes import LEAVES, trace_rec as _rec  # noqa: F401

def _ns(us: float) -> int:
    return int(round(us * 1000))


def _tiles(body: dict) -> int:
    ev = body["traceEvents"]
    n = 0
    for s in (e for e in ev if e.get("cat") == "decode"):
        lo, hi = _ns(s["ts"]), _ns(s["ts"]) + _ns(s["dur"])
        inner = [e for e in ev if e.get("cat") == "phase" and e["tid"] == s["tid"]
                 and lo <= _ns(e["ts"]) < hi + 1 and _ns(e["ts"]) + _ns(e["dur"]) <= hi]
        top = [e for e in inner if not e["name"].startswith("verify_")]
        cur = lo
        for e in top:
            assert _ns(e["ts"]) == cur
            cur += _ns(e["dur"])
        assert cur == hi
        v = next(e for e in top if e["name"] == "verify")
        cur = _ns(v["ts"])
        for k in (e for e in inner if e["name"].startswith("verify_")):
            assert _ns(k["ts"]) == cur
            cur += _ns(k["dur"])
        assert cur == _ns(v["ts"]) + _ns(v["dur"])
        n += 1
    return n


times = st.lists(st.floats(0.001, 40.0, allow_nan=False), min_size=len(LEAVES), max_size=len(LEAVES))


@settings(max_examples=60, deadline=None)
@given(st.lists(times, min_size=1, max_size=6))
def test_phases_tile_every_step_exactly(steps):
    recs, t = [], 1_000_000_000
    for i, ts in enumerate(steps):
        recs.append(_rec(i, t, ts).to_dict())
        t += int(sum(ts) * 1e6) + 5000
    body = json.loads(json.dumps(steps_trace([({"tp": 0, "dp": 0, "pp": 0}, recs)], len(recs))))
    assert _tiles(body) == len(steps)


def test_tracks_per_rank_in_time_order_with_args_and_prefill():
    a, b = RankId(dp=0), RankId(dp=1)
    ra = [_rec(2, 3_000_000, [1, 2, 1, 0.5, 0.5, 0.1]), _rec(1, 1_000_000, [1] * 6, kind="prefill", ctx=(50,))]
    rb = [_rec(7, 2_000_000, [0.2] * 6, ctx=(4000,))]
    body = steps_trace([(a.to_dict(), [r.to_dict() for r in ra]), (b.to_dict(), [r.to_dict() for r in rb])], 10)
    ev = body["traceEvents"]
    assert [e["args"]["name"] for e in ev if e["name"] == "thread_name"] == ["rank tp0-dp0-pp0", "rank tp0-dp1-pp0"]
    track1 = [e for e in ev if e.get("tid") == 1 and e.get("cat") in ("decode", "prefill")]
    assert [e["name"] for e in track1] == ["prefill", "decode step"]  # sorted by start, not by arrival
    assert track1[0]["ts"] == 0 and track1[0]["args"]["prompt_tokens"] == 50
    step = track1[1]["args"]
    assert step["batch_size"] == 2 and step["ctx_mean"] == 200.0 and step["ctx_sum"] == 400
    assert body["otherData"]["bound"].startswith("the last 10 step records per rank")
    assert "text" not in json.dumps(body)


def test_request_trace_has_prefill_steps_and_the_request():
    agg = Aggregator()
    agg.observe(_rec(1, 1_000_000, [1] * 6, kind="prefill", ctx=(64,)))
    for i in range(3):
        agg.observe(_rec(2 + i, 20_000_000 + i * 10_000_000, [0.5, 1, 2, 0.25, 0.75, 0.3], ctx=(65 + 3 * i,)))
    body = request_trace(agg.request("r0"))
    names = [(e["tid"], e["name"]) for e in body["traceEvents"] if e["ph"] == "X" and e["cat"] != "phase"]
    assert names == [(1, "request"), (2, "prefill")] + [(2, "decode step")] * 3
    assert _tiles(body) == 3
    req = next(e for e in body["traceEvents"] if e["name"] == "request")
    last = [e for e in body["traceEvents"] if e["name"] == "decode step"][-1]
    assert _ns(req["ts"]) + _ns(req["dur"]) == _ns(last["ts"]) + _ns(last["dur"])


def test_the_recent_ring_is_bounded_and_reset():
    agg = Aggregator()
    for i in range(MAX_TRACE_STEPS + 10):
        agg.observe(_rec(i, i * 1000, [0.1] * 6))
    assert len(agg.recent) == MAX_TRACE_STEPS
    last = agg.recent_steps(5)
    assert [r["step_id"] for r in last] == list(range(MAX_TRACE_STEPS + 5, MAX_TRACE_STEPS + 10))
    assert len(agg.recent_steps(10 ** 6)) == MAX_TRACE_STEPS
    agg.reset()
    assert agg.recent_steps(5) == []
