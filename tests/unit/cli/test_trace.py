"""``sglang-ctxprof trace --perfetto``: the trace events are written whole (a failed write leaves
what was there), and a path that cannot be written is one ``error:`` line naming it."""

from __future__ import annotations

import errno
import json
import os

import pytest

from http_fakes import JsonHandler, Servers
from sglang_ctxprof.cli.main import main

EVENTS = {"traceEvents": [{"ph": "X", "cat": "decode", "name": "step", "ts": 0, "dur": 5}]}


class _Trace(JsonHandler):
    other: object = None

    def do_GET(self):
        self._json(200, EVENTS if self.other is None else {**EVENTS, "otherData": self.other})


@pytest.fixture()
def url():
    servers = Servers()
    yield servers.start(_Trace)
    servers.close()


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_perfetto_writes_the_events(url, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["trace", "--url", url, "--perfetto", str(out)]) == 0
    assert json.loads(out.read_text()) == EVENTS and "wrote 1 trace events" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_perfetto_into_a_missing_folder_is_one_line(url, tmp_path, capsys):
    out = tmp_path / "missing" / "t.json"
    assert main(["trace", "--url", url, "--perfetto", str(out)]) == 2
    assert str(out) in _one_error(capsys)


def test_a_failed_perfetto_write_leaves_the_old_file(url, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.json"
    out.write_text("old")

    def full(*a, **kw):  # the new file cannot be put in place (a full disk, a quota)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["trace", "--url", url, "--perfetto", str(out)]) == 2
    line = _one_error(capsys)
    assert "No space left on device" in line and str(out) in line and out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize("body", [[1, 2], {"requests": [{"rid": "r", "step_rows": [{"phases_ms": None}]}]},
                                  {"requests": [{"rid": "r", "waterfall": {"wall_ms": None}}]},
                                  {"requests": [{"rid": "r", "step_rows": [{"step_id": 1}]}]}],
                         ids=["a-list", "null-phases", "null-wall", "short-row"])
def test_an_answer_of_another_shape_is_one_line(body, capsys):
    class _Odd(JsonHandler):
        def do_GET(self):
            self._json(200, body)

    servers = Servers()
    try:
        assert main(["trace", "--url", servers.start(_Odd), "--slowest", "1"]) == 2
    finally:
        servers.close()
    assert "another shape" in _one_error(capsys)


@pytest.mark.parametrize("other, said", [({"steps_left_out": 5}, "5 older step(s) left out"), ("x", None),
                                         ([1], None), ({"steps_left_out": True}, None)])
def test_perfetto_says_the_steps_the_ranks_left_out(tmp_path, capsys, other, said):
    servers = Servers()
    try:
        url = servers.start(_Trace, other=other)
        assert main(["trace", "--url", url, "--perfetto", str(tmp_path / "t.json")]) == 0
    finally:
        servers.close()
    out = capsys.readouterr()
    assert "Traceback" not in out.err and ("left out" in out.out) == (said is not None), out
    assert said is None or said in out.out
