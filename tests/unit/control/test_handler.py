"""control/handler: every command answers exactly once; bad input is a bad request that loses
nothing, a failure of ours degrades the ``control`` component, and the read-only snapshot starts
nothing (``Profiler.identify``, not ``bind``)."""

from __future__ import annotations

import json

import pytest

import fakes
from sglang_ctxprof.collect.session import CtxProfSession
from sglang_ctxprof.control.handler import handle
from sglang_ctxprof.control.protocol import encode
from sglang_ctxprof.model import names
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.testing.session import instrumented
from sglang_ctxprof.views.exporters import Exporters
from sglang_ctxprof.views.policy import TracePolicy

KEY = names.CONTROL_KEY


@pytest.fixture
def session():
    with instrumented([]) as s:
        yield s


def ask(session, cmd, **args):
    return handle(encode(cmd, **args), fakes.Scheduler(fakes.Worker()), session)[KEY]


def _rec(i, rid="a"):
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100,),
                      accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4, step_ms=1.0,
                      phases_ms={"draft": 0.5, "verify": 0.5}, t_start_ns=10**18 + i)


def test_snapshot_reads_the_scheduler_but_starts_nothing(session):
    p = session.profiler
    body = ask(session, names.CMD_SNAPSHOT)
    assert body["schema_version"] == names.SCHEMA_VERSION and body["status"]["algorithm"] == "EAGLE"
    assert p.recorder._thread is None  # the drain thread starts with the first step, not a read
    assert p.graph is None and p.exporters is None


def test_snapshot_includes_every_submitted_record(session):
    p = session.profiler
    for i in range(3):
        p.recorder.submit(_rec(i))  # queued, not drained: the snapshot flushes first
    body = ask(session, names.CMD_SNAPSHOT)
    assert body["status"]["submitted"] == 3
    assert body["state"]["records"] == 3


@pytest.mark.parametrize("rid", [encode("no_such_command"), encode(names.CMD_REQUESTS, slowest="many"),
                                 encode(names.CMD_RECENT, last=[1]), names.CONTROL_RID_PREFIX + ":{not json",
                                 names.CONTROL_RID_PREFIX + ':{"no": "cmd"}'])
def test_bad_input_is_a_bad_request_and_the_channel_stays_up(session, rid):
    body = handle(rid, fakes.Scheduler(fakes.Worker()), session)[KEY]
    assert body.get("bad_request") is True and body["error"]
    assert session.profiler.guard.status() is None  # nothing disabled by a client's mistake
    assert "status" in ask(session, names.CMD_STATUS)


def test_a_failure_of_ours_degrades_control_and_every_later_command_still_answers(session, monkeypatch):
    p = session.profiler

    def broken():
        raise RuntimeError("status broke")

    monkeypatch.setattr(p, "status", broken)
    body = ask(session, names.CMD_STATUS)
    assert "status broke" in body["error"] and "control" in body["degraded"]["components"]
    later = ask(session, names.CMD_RESET)
    assert "disabled after a failure" in later["error"]


def test_without_a_profiler_it_answers_an_error():
    body = handle(encode(names.CMD_STATUS), object(), CtxProfSession(CtxProfConfig(), targets=[]))[KEY]
    assert "not installed" in body["error"]


def test_trace_policy_reads_changes_and_refuses_bad_values(session):
    p = session.profiler
    assert "not installed" in ask(session, names.CMD_TRACE_POLICY)["error"]
    p.attach_exporters(Exporters(Bucketing.parse("pow2"), TracePolicy(mode="off"), env={}))
    body = ask(session, names.CMD_TRACE_POLICY, set={"slow_tok_s": 7})
    assert body["trace_policy"]["slow_tok_s"] == 7 and body["exporters"]["policy"]["slow_tok_s"] == 7
    bad = ask(session, names.CMD_TRACE_POLICY, set={"mode": "sometimes"})
    assert bad["bad_request"] is True and p.exporters.policy_dict()["slow_tok_s"] == 7


def test_toggle_and_recent(session):
    p = session.profiler
    assert ask(session, names.CMD_DISABLE)["status"]["enabled"] is False and not p.active
    assert ask(session, names.CMD_ENABLE)["status"]["enabled"] is True and p.active
    p.recorder.submit(_rec(1))
    p.recorder.submit(_rec(2))
    got = ask(session, names.CMD_RECENT, last=1)
    assert [r["step_id"] for r in map(json.loads, got["steps_rows"])] == [2] and got["steps_left_out"] == 0


def test_slowest_requests_ship_no_step_rows_unless_asked(session):
    p = session.profiler
    for i in range(4):
        p.recorder.submit(_rec(i, rid="a" if i % 2 else "b"))
    plain = ask(session, names.CMD_REQUESTS, slowest=10)["requests"]
    assert {r["rid"] for r in plain} == {"a", "b"} and all(r["steps"] == 2 for r in plain)
    assert not any("step_rows" in r for r in plain)  # the page's table uses none of them
    full = ask(session, names.CMD_REQUESTS, slowest=10, steps=True)["requests"]
    assert all(len(r["step_rows"]) == r["steps"] == 2 for r in full)  # the CLI's trace --slowest
    one = ask(session, names.CMD_REQUESTS, rid="a")["requests"]
    assert len(one[0]["step_rows"]) == 2  # one request by rid keeps its rows (the page's drill-down)


def test_reset_with_a_clock_switches_it_and_a_bad_clock_is_a_bad_request(session):
    p = session.profiler
    p.recorder.submit(_rec(0))
    bad = ask(session, names.CMD_RESET, clock="gpu")
    assert bad["bad_request"] and "unknown clock 'gpu'" in bad["error"]
    assert p.clock_name == names.CLOCK_WALL and ask(session, names.CMD_SNAPSHOT)["state"]["records"] == 1
    body = ask(session, names.CMD_RESET, clock=names.CLOCK_THREAD)
    assert body["reset"] and body["status"]["clock"] == names.CLOCK_THREAD
    assert body["status"]["timing"] == names.TIMING_CPU_THREAD
    assert ask(session, names.CMD_RESET)["status"]["clock"] == names.CLOCK_THREAD  # a plain reset keeps it


def test_a_snapshot_the_reader_holds_is_answered_unchanged_until_the_state_moves(session):
    p = session.profiler
    p.recorder.submit(_rec(0))
    first = ask(session, names.CMD_SNAPSHOT)
    v = first["version"]
    same = ask(session, names.CMD_SNAPSHOT, known=["someone-else", v])
    assert same["unchanged"] == v and "state" not in same and same["status"]["submitted"] == 1
    assert same["status"]["states"] == {"written": 1, "unchanged": 1}
    p.recorder.submit(_rec(1))  # a new record: a new version, and the state again
    moved = ask(session, names.CMD_SNAPSHOT, known=[v])
    assert moved["version"] != v and moved["state"]["records"] == 2
    ask(session, names.CMD_RESET)  # a reset with nothing new after it is a new state too
    reset = ask(session, names.CMD_SNAPSHOT, known=[v, moved["version"]])
    assert reset["state"]["records"] == 0 and reset["version"] not in (v, moved["version"])
    bad = ask(session, names.CMD_SNAPSHOT, known="all")
    assert bad["bad_request"] and p.guard.ok("control")


def test_slowest_requests_with_their_steps_ship_a_bounded_number_of_rows(session, monkeypatch):
    """``?slowest=N&steps=1`` builds the rows on the scheduler thread: at most ``MAX_READ_STEP_ROWS``
    rows per answer, the slowest requests' first; a request past the budget comes without its rows,
    saying how many were left out (one request by rid still ships all of its own)."""
    from sglang_ctxprof.control import handler

    monkeypatch.setattr(handler, "MAX_READ_STEP_ROWS", 5)
    p = session.profiler
    for i in range(12):
        p.recorder.submit(_rec(i, rid="abc"[i % 3]))
    full = ask(session, names.CMD_REQUESTS, slowest=10, steps=True)["requests"]
    shipped = [len(r.get("step_rows") or ()) for r in full]
    assert sum(shipped) <= 5 and shipped[0] == 4 and all(r["steps"] == 4 for r in full)
    assert [r.get("step_rows_left_out", 0) for r in full] == [0 if n else 4 for n in shipped]
    assert len(ask(session, names.CMD_REQUESTS, rid="a")["requests"][0]["step_rows"]) == 4


def test_every_answer_says_how_long_the_scheduler_thread_spent_on_it(session):
    """The HTTP process's read gate counts that time toward a read's cool-down (a read that built
    thousands of rows on the scheduler waits longer before the next one)."""
    for cmd, args in ((names.CMD_STATUS, {}), (names.CMD_REQUESTS, {"slowest": 3, "steps": True}),
                      (names.CMD_SNAPSHOT, {})):
        out = ask(session, cmd, **args)
        assert isinstance(out[names.PAYLOAD_SCHED_S], float) and 0 <= out[names.PAYLOAD_SCHED_S] < 60, (cmd, out)
