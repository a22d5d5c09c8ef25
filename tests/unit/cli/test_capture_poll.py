"""``sglang-ctxprof capture`` against a fake server: the status poll rides out a scheduler that is
late with its answer (HTTP 504) within its deadline, and writes the trace and timeline whole; an
odd answer is one line, never a traceback; a timeline the server will not give leaves the trace."""

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
    posted = ()  # (the Authorization header of each POST)
    post_body: object = {"accepted": True, "captures": [{"id": "c1"}]}
    status_body: object = {"ranks": [{"status": {"capture": {"captures": [DONE]}}}]}
    timeline = 200

    cancel = (200, {"cancelled": [{"id": "c1", "state": names.CAPTURE_FAILED, "step_ids": []}]})
    paths = ()  # (the path of each POST)

    def do_POST(self):
        type(self).paths += (self.path,)
        if self.path.startswith(names.ROUTE_CAPTURE_CANCEL):
            return self._json(*self.cancel)
        type(self).posted += (self.headers.get("Authorization"),)
        if isinstance(self.post_body, bytes):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.post_body)))
            self.end_headers()
            return self.wfile.write(self.post_body)
        self._json(200, self.post_body)

    def do_GET(self):
        cls = type(self)
        if self.path == names.ROUTE_STATUS:
            cls.polls += 1
            if cls.polls <= cls.late:
                return self._json(504, {"error": LATE})
            return self._json(200, self.status_body)
        if self.path.endswith("format=trace"):
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            return self.wfile.write(b"\x1f\x8bxx")
        if self.timeline != 200:
            return self._json(self.timeline, {"error": "the timeline would be over 64 MiB: fetch ?format=trace"})
        return self._json(200, {"traceEvents": [], "otherData": {"clock": {"aligned_on": "steps"}}})


@pytest.fixture()
def serve():
    servers = Servers()
    def start(**attrs):
        return servers.start(_Capture, **{"polls": 0, "posted": (), "paths": (), **attrs})

    start.handler = lambda: servers.made[-1].RequestHandlerClass  # the last server's (its class attributes)
    yield start
    servers.close()


def test_a_late_scheduler_504_is_polled_again(serve, tmp_path, capsys):
    assert main(["capture", "--url", serve(late=2), "--out", str(tmp_path)]) == 0
    assert "capture c1" in capsys.readouterr().out
    assert (tmp_path / "c1.trace.json.gz").read_bytes() == b"\x1f\x8bxx"
    assert json.loads((tmp_path / "c1.timeline.json").read_text())["traceEvents"] == []
    assert not list(tmp_path.glob("*.tmp"))


def test_a_scheduler_that_stays_late_ends_at_the_deadline_with_its_reason_and_the_capture_cancelled(
        serve, tmp_path, capsys):
    assert main(["capture", "--url", serve(late=10**9), "--out", str(tmp_path), "--timeout", "0"]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "not done" in lines[0] and "504" in lines[0] and LATE in lines[0], err
    assert serve.handler().paths[-1] == names.ROUTE_CAPTURE_CANCEL + "?id=c1"  # not left holding the server's one
    assert "capture c1 cancelled on the server" in out
    two = {"accepted": True, "captures": [{"id": "c1"}, {"id": "c7"}, {"id": "c1"}]}  # DP groups apart
    assert main(["capture", "--url", serve(late=10**9, post_body=two), "--out", str(tmp_path), "--timeout", "0"]) == 2
    assert serve.handler().paths[1:] == (names.ROUTE_CAPTURE_CANCEL + "?id=c1", names.ROUTE_CAPTURE_CANCEL + "?id=c7")


def test_the_wait_goes_with_the_ask_and_cancel_is_one_line_either_way(serve, tmp_path, capsys):
    url = serve()
    assert main(["capture", "--url", url, "--rid", "r 1", "--wait-s", "5", "--out", str(tmp_path)]) == 0
    assert serve.handler().paths == (names.ROUTE_CAPTURE + "?rid=r+1&wait_s=5.0",)
    capsys.readouterr()
    assert main(["capture", "--url", url, "--cancel"]) == 0
    assert main(["capture", "--url", url, "--cancel", "c1"]) == 0
    assert serve.handler().paths[-2:] == (names.ROUTE_CAPTURE_CANCEL, names.ROUTE_CAPTURE_CANCEL + "?id=c1")
    assert capsys.readouterr().out.count("capture c1 cancelled: failed, steps []") == 2
    url = serve(cancel=(404, {"error": "no capture is pending or running", "cancelled": []}))
    assert main(["capture", "--url", url, "--cancel"]) == 2
    err = capsys.readouterr().err
    assert "nothing cancelled: no capture is pending or running" in err and "Traceback" not in err


@pytest.mark.parametrize("attrs", [{"post_body": b"<html>not sglang</html>"}, {"post_body": {"accepted": True}},
                                   {"post_body": ["c1"]}, {"status_body": ["not", "an", "object"]},
                                   {"status_body": {"ranks": [{"status": None}, "x"]}},
                                   {"status_body": {"ranks": [{"status": {"capture": {"captures": [
                                       {"id": "c1", "state": names.CAPTURE_DONE}]}}}]}}],
                         ids=["html", "no-captures", "a-list", "status-list", "status-null", "record-short"])
def test_an_odd_answer_is_one_line_never_a_traceback(serve, tmp_path, capsys, attrs):
    code = main(["capture", "--url", serve(**attrs), "--out", str(tmp_path), "--timeout", "0"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and code in (0, 2), err
    assert code == 0 or len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err


def test_an_unusable_url_is_one_line(tmp_path, capsys):
    assert main(["capture", "--url", "http://127.0.0.1:abc", "--out", str(tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_timeline_the_server_will_not_give_leaves_the_saved_trace(serve, tmp_path, capsys):
    assert main(["capture", "--url", serve(timeline=413), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"trace: {tmp_path / 'c1.trace.json.gz'}" in out and "merged timeline: not written (HTTP 413" in out
    assert (tmp_path / "c1.trace.json.gz").read_bytes() == b"\x1f\x8bxx"


def test_a_server_with_only_an_api_key_gets_it_on_the_capture_post(serve, tmp_path):
    url = serve()
    assert main(["capture", "--url", url, "--api-key", "k", "--out", str(tmp_path)]) == 0
    assert main(["capture", "--url", url, "--api-key", "k", "--admin-key", "a", "--out", str(tmp_path)]) == 0
    assert serve.handler().posted == ("Bearer k", "Bearer a")  # the admin key where given, else the api key
