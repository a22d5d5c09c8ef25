"""views/logs.py and sinks.py: slow_step (rate-limited), slow_request, summary; no global logging changes."""

from __future__ import annotations

import json
import logging

import structlog
from structlog.testing import LogCapture

from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.testing.session import fed
from sglang_ctxprof.views.exporters import Exporters
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.views.policy import TracePolicy
from sglang_ctxprof.model.config import CtxProfConfig, LogSettings
from sglang_ctxprof.views.logs import LogView, make_logger


def _logs(env):
    return CtxProfConfig.from_env(env).logs


def _step(i, ms, rid="a", fin=False, kind="decode"):
    return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100 + i,),
                      accepted=(2,), committed=(2,), finished=(fin,), draft_tokens=4, step_ms=ms,
                      phases_ms={"draft": ms / 2, "verify": ms / 2}, t_start_ns=1000 + i)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _view(cfg=LogSettings(slow_steps_per_min=2), policy=TracePolicy(mode="slow", slow_tok_s=50, slow_step_ms=100)):
    cap = LogCapture()
    clock = Clock()
    view = LogView(cfg, lambda: policy, logger=make_logger(cfg, renderer=cap, file=open("/dev/null", "w")),
                   clock=clock)
    return view, cap, clock


def test_slow_step_is_rate_limited_with_all_fields():
    view, cap, clock = _view()
    for i in range(5):
        view.on_step(_step(i, 500.0))
    ev = [e for e in cap.entries if e["event"] == "slow_step"]
    assert len(ev) == 2 and view.suppressed == 3
    assert ev[0]["log_level"] == "warning" and ev[0]["step_ms"] == 500.0 and ev[0]["rids"] == ["a"]
    assert ev[0]["phases_ms"] == {"draft": 250.0, "verify": 250.0} and ev[0]["ctx_lens"] == [100]
    clock.t = 30.0  # half a minute refills one token
    view.on_step(_step(9, 500.0))
    ev = [e for e in cap.entries if e["event"] == "slow_step"]
    assert len(ev) == 3 and ev[-1]["suppressed"] == 3
    view.on_step(_step(10, 1.0))  # fast steps never log
    assert len([e for e in cap.entries if e["event"] == "slow_step"]) == 3


def test_slow_request_through_sinks_and_summary():
    view, cap, clock = _view()
    s = fed(lambda facts: Exporters(Bucketing.parse("pow2"), TracePolicy(mode="off", slow_tok_s=50, slow_step_ms=0),
                                    facts=facts, logs=view))
    for i in range(3):
        s.requests.observe(_step(i, 100.0, rid="slow-1", fin=i == 2))  # 6 tokens in 0.3 s = 20 tok/s
        s.steps.observe(_step(i, 100.0, rid="slow-1"))
    for i in range(3):
        s.requests.observe(_step(10 + i, 1.0, rid="fast-1", fin=i == 2))
    ev = [e for e in cap.entries if e["event"] == "slow_request"]
    assert [e["rid"] for e in ev] == ["slow-1"]
    assert ev[0]["steps"] == 3 and ev[0]["committed"] == 6 and ev[0]["traced"] is False
    assert "decode_tok_s 20.0 < 50" in ev[0]["reason"]
    assert s.status()["requests_finished"] == 2
    clock.t = 10.0
    summ = view.emit_summary()
    assert summ["steps"] == 3 and summ["requests_finished"] == 2 and summ["slow_requests"] == 1
    assert cap.entries[-1]["event"] == "ctx_profile_summary" and cap.entries[-1]["log_level"] == "info"
    n = len(cap.entries)
    view.emit_summary()  # idle window: debug, filtered out at the default info level
    assert len(cap.entries) == n


def test_emitted_counts_only_lines_the_level_let_through():
    for level, busy, written in (("info", False, 0), ("warning", True, 0), ("debug", False, 1), ("info", True, 1)):
        view, cap, clock = _view(cfg=LogSettings(level=level))
        if busy:
            view.on_step(_step(0, 1.0))
        view.emit_summary()
        assert len(cap.entries) == written
        assert view.status()["emitted"]["ctx_profile_summary"] == written, (level, busy)


def test_json_file_output_and_no_global_logging_change(tmp_path):
    root_handlers = list(logging.getLogger().handlers)
    cfg_before = structlog.get_config()["processors"][:]
    path = tmp_path / "ev.jsonl"
    cfg = _logs({"SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": str(path),
                              "SGLANG_CTXPROF_LOG_LEVEL": "info"})
    view = LogView(cfg, lambda: TracePolicy(slow_tok_s=50))
    view.on_request({"rid": "r9", "steps": 2, "decode_tok_s": 3.0, "step_rows": [{"step_ms": 1.0}]},
                    "decode_tok_s 3.0 < 50", traced=True)
    view.emit_summary()  # one request finished in the window -> info
    view.emit_summary()  # idle -> debug -> filtered at info
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["event"] for x in lines] == ["slow_request", "ctx_profile_summary"]
    assert lines[1]["requests_finished"] == 1 and lines[1]["slow_requests"] == 1
    assert lines[0]["rid"] == "r9" and lines[0]["level"] == "warning" and lines[0]["traced"] is True
    assert "timestamp" in lines[0]
    assert logging.getLogger().handlers == root_handlers
    assert structlog.get_config()["processors"] == cfg_before


def test_bad_log_settings():
    import pytest

    for env in ({"SGLANG_CTXPROF_LOG": "xml"}, {"SGLANG_CTXPROF_LOG_LEVEL": "loud"},
                {"SGLANG_CTXPROF_LOG_SUMMARY_S": "often"}):
        with pytest.raises(ValueError):
            _logs(env)


def test_a_pipe_nobody_reads_never_blocks_the_caller_and_drops_are_counted():
    """stderr piped to a collector that stopped reading: the events go through a bounded queue and
    a writer thread, so the recorder's drain thread (the caller) goes on; past the queue a line is
    dropped and counted, and stop() returns."""
    import os
    import threading

    from sglang_ctxprof.views.logs import Lines

    r, w = os.pipe()
    out = os.fdopen(w, "w")
    cfg = LogSettings(fmt="json", summary_s=0)
    view = LogView(cfg, lambda: TracePolicy(mode="slow", slow_tok_s=1e9, slow_step_ms=0),
                   logger=make_logger(cfg, file=out))
    lines = view._lines()
    assert isinstance(lines, Lines) and lines._q is not None  # a pipe: the writer thread's
    lines.cap = 50
    req = {"rid": "x" * 2000, "steps": 3, "committed": 6, "accepted": 6, "decode_ms": 10.0}

    def emit():
        for _ in range(500):  # ~1 MB of events: far past a pipe's 64 KiB
            view.on_request(req, "slow", False)
        view.stop()

    t = threading.Thread(target=emit, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a pipe nobody reads blocked the caller"
    assert view.status()["lines_dropped"] > 0 and view.emitted["slow_request"] == 500
    os.close(r)


def test_a_regular_file_is_written_at_once(tmp_path):
    cfg = LogSettings(fmt="json", summary_s=0)
    out = open(tmp_path / "ev.log", "w")
    view = LogView(cfg, lambda: TracePolicy(mode="slow", slow_tok_s=1e9, slow_step_ms=0),
                   logger=make_logger(cfg, file=out))
    view.on_request({"rid": "a", "steps": 1}, "slow", False)
    assert json.loads((tmp_path / "ev.log").read_text())["rid"] == "a"  # no thread, no wait
    view.stop()


def test_a_fifo_nobody_reads_as_the_log_file_never_holds_the_start(tmp_path, caplog):
    """``open`` of a FIFO for writing waits for a reader: at the scheduler's start that would hang
    SGLang.  The log view refuses it in one warning; the other exporters are built."""
    import os
    import threading

    from sglang_ctxprof.views import exporters

    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    cfg = CtxProfConfig.from_env({"SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": str(fifo)})
    got = []
    with caplog.at_level(logging.WARNING, logger="sglang_ctxprof.views.exporters"):
        t = threading.Thread(target=lambda: got.append(exporters.build(cfg, env={})), daemon=True)
        t.start()
        t.join(60)
        if t.is_alive():  # free the stuck open so the suite goes on, then fail
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            t.join(10)
            raise AssertionError("opening the log FIFO waited for a reader")
    exp = got[0]
    assert exp.steps.logs is None and exp.requests is not None
    assert any("events.fifo" in r.getMessage() and "logs are off" in r.getMessage() for r in caplog.records)
