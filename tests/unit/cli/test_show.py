"""``show --url A --url B``: servers merged exactly, and who gave what (cli/show.merge_servers).

Each server's body is what ``GET /ctx_profile?format=state`` answers (views.http.served_state over
real Aggregator states, through JSON).  The merge must equal one aggregator that saw both servers'
steps; different bucketings are refused with one clear line.  The live check with two real CPU
servers is tests/server/test_ui.py.
"""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.cli.main import CliError
from sglang_ctxprof.cli.show import _fleet_text, merge_servers
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.views.http import served_state
from sglang_ctxprof.views.profile import build_profile
from record_fakes import trace_rec as _rec


def _body(agg: Aggregator, dropped: int = 0) -> dict:
    payload = {"status": {"enabled": True, "dropped": dropped, "rank": {"tp": 0, "dp": 0, "pp": 0}}, "state": agg.state()}
    return json.loads(json.dumps(served_state([json.loads(json.dumps(payload))])))


def test_two_servers_merge_to_the_sum_and_say_who_gave_what():
    a, b, both = Aggregator(), Aggregator(), Aggregator()
    for i, ctx in enumerate((70, 90, 3000)):
        r = _rec(i, i, [0.5, 1, 2, 0.25, 0.75, 0.3], ctx=(ctx,))
        a.observe(r)
        both.observe(r)
    for i, ctx in enumerate((80, 9000)):
        r = _rec(10 + i, i, [0.4, 1.5, 2, 0.5, 0.5, 0.1], ctx=(ctx, ctx))
        b.observe(r)
        both.observe(r)
    merged, servers, by_bucket = merge_servers([("http://a", _body(a, 2)), ("http://b", _body(b, 3))])
    want = build_profile(both.snapshot())
    assert merged.totals.decode_steps == 5 == want.totals.decode_steps
    assert [(x.label, x.steps, x.req_steps, x.accepted) for x in merged.buckets] == \
        [(x.label, x.steps, x.req_steps, x.accepted) for x in want.buckets]
    for x, y in zip(merged.buckets, want.buckets):
        assert x.phases["step"].p90_ms == y.phases["step"].p90_ms  # histograms merged, not means averaged
        assert x.phases["step"].total_ms == pytest.approx(y.phases["step"].total_ms)
    assert [(s["url"], s["decode_steps"], s["request_steps"], s["dropped"]) for s in servers] == \
        [("http://a", 3, 3, 2), ("http://b", 2, 4, 3)]
    assert merged.dropped == 5
    assert by_bucket == {"64-127": {"http://a": 2, "http://b": 1}, "2048-4095": {"http://a": 1},
                         "8192-16383": {"http://b": 1}}
    text = _fleet_text(merged, servers, by_bucket)
    assert "fleet of 2 servers" in text and "#2 = http://b" in text and "= merged" in text


def test_different_bucketing_is_refused():
    a, b = Aggregator(), Aggregator(Bucketing.parse("fixed:1000"))
    a.observe(_rec(1, 1, [1] * 6))
    b.observe(_rec(1, 1, [1] * 6))
    with pytest.raises(CliError, match="SGLANG_CTXPROF_BUCKETS"):
        merge_servers([("http://a", _body(a)), ("http://b", _body(b))])


def test_a_rank_that_did_not_answer_is_said_not_counted():
    """A server of two ranks, one of which gave no state: its state route says so, and the fleet view
    counts one rank there and warns that its numbers are partial."""
    a, b = Aggregator(), Aggregator()
    a.observe(_rec(1, 1, [1] * 6))
    b.observe(_rec(2, 1, [1] * 6))
    ok = {"status": {"enabled": True, "dropped": 0, "rank": {"tp": 0, "dp": 0, "pp": 0}}, "state": a.state()}
    half = json.loads(json.dumps(served_state([ok, {"error": "rank dp1 did not answer"}])))
    assert half["ranks"] == 2 and half["answered"] == 1 and half["missing"] == ["rank dp1 did not answer"]
    merged, servers, _ = merge_servers([("http://a", half), ("http://b", _body(b))])
    assert len(merged.ranks) == 2 and [(s["answered"], s["ranks"]) for s in servers] == [(1, 2), (1, 1)]
    text = _fleet_text(merged, servers, {})
    assert "http://a: 1 of 2 ranks answered (rank dp1 did not answer): its numbers are partial" in text
    assert "1/2" in next(ln for ln in text.splitlines() if ln.startswith("http://a"))
