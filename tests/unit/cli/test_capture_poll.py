"""``sglang-ctxprof capture`` against a fake server: the status poll rides out a scheduler that is
late with its answer (HTTP 504) within its deadline, and writes the trace and timeline whole."""

from __future__ import annotations

import json

import pytest

from http_fakes import JsonHandler, Servers
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.model import names

LATE = "a scheduler has not answered the 'status' command sent 2 s ago"
DONE = {"id": "c1", "state": names.CAPTURE_DONE, "trigger": "manual", "step_ids": [5, 6], "bytes": 10,
        "export_ms": 3.0, "stop_ms": 1.0, "path": "/srv/c1.trace.json.gz"}


class _Capture(JsonHandler):
    late = 0  # status polls answered 504 first (a very large number: always)
    polls = 0

    def do_POST(self):
        self._json(200, {"accepted": True, "captures": [{"id": "c1"}]})

    def do_GET(self):
        cls = type(self)
        if self.path == names.ROUTE_STATUS:
            cls.polls += 1
            if cls.polls <= cls.late:
                return self._json(504, {"error": LATE})
            return self._json(200, {"ranks": [{"status": {"capture": {"captures": [DONE]}}}]})
        if self.path.endswith("format=trace"):
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            return self.wfile.write(b"\x1f\x8bxx")
        return self._json(200, {"traceEvents": [], "otherData": {"clock": {"aligned_on": "steps"}}})


@pytest.fixture()
def serve():
    servers = Servers()
    yield lambda **attrs: servers.start(_Capture, **{"polls": 0, **attrs})
    servers.close()


def test_a_late_scheduler_504_is_polled_again(serve, tmp_path, capsys):
    assert main(["capture", "--url", serve(late=2), "--out", str(tmp_path)]) == 0
    assert "capture c1" in capsys.readouterr().out
    assert (tmp_path / "c1.trace.json.gz").read_bytes() == b"\x1f\x8bxx"
    assert json.loads((tmp_path / "c1.timeline.json").read_text())["traceEvents"] == []
    assert not list(tmp_path.glob("*.tmp"))


def test_a_scheduler_that_stays_late_ends_at_the_deadline_with_its_reason(serve, tmp_path, capsys):
    assert main(["capture", "--url", serve(late=10**9), "--out", str(tmp_path), "--timeout", "0"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "not done" in lines[0] and "504" in lines[0] and LATE in lines[0], err
