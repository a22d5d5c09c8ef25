"""``views.http_capture``: a capture's merged timeline, on the real routes (FastAPI TestClient).

The schedulers' control channel is a fake answering ``capture`` with one done capture whose trace
file is written here; the real-server proof of the whole capture path is
tests/server/test_deep_capture.py.  A trace file that cannot be read is a 409 and one too large
to merge here a 413: neither is a failure of ours, so neither counts against the routes.
"""

from __future__ import annotations

import gzip
import json

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.views import http, http_capture, http_guard

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

CID = "1-manual-0"
TRACE = {"baseTimeNanoseconds": 0, "traceEvents": [
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": 10.0, "dur": 5.0}]}


class FakeChannel:
    def __init__(self, path: str):
        self.path = path

    async def ask(self, cmd: str, **args):
        assert cmd == names.CMD_CAPTURE and args == {"id": CID}, (cmd, args)
        info = {"id": CID, "trigger": "manual", "state": names.CAPTURE_DONE, "path": self.path, "step_ids": []}
        return [{"rank": {"tp": 0}, "capture": info, "steps": []}]


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / f"{CID}.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TRACE, f)
    return path


@pytest.fixture()
def client(monkeypatch, trace_file):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    app = fastapi.FastAPI()
    http.install_routes(app, FakeChannel(str(trace_file)), admin=lambda f: f)
    return TestClient(app, raise_server_exceptions=False)


URL = f"{names.ROUTE_CAPTURE}/{CID}?format=timeline"


def test_the_timeline_merges_the_trace_file(client):
    r = client.get(URL)
    assert r.status_code == 200, r.text
    assert sum(1 for e in r.json()["traceEvents"] if e.get("name") == "aten::mm") == 1


def test_a_truncated_trace_file_is_a_409_and_switches_nothing_off(client, trace_file):
    trace_file.write_bytes(trace_file.read_bytes()[:20])
    for _ in range(http_guard.STRIKES + 1):
        r = client.get(URL)
        assert r.status_code == 409 and "cannot be read as a trace" in r.json()["error"], r.text
    assert http_guard.guard().ok("http") and client.get(names.ROUTE_CAPTURE + f"/{CID}").status_code == 200


@pytest.mark.parametrize("content", [b"[]", b"5", b'{"traceEvents": 5}', b'{"traceEvents": [1, 2]}',
                                     b'{"traceEvents": [], "otherData": []}', "damaged deflate"])
def test_a_file_that_is_no_trace_is_a_409_and_switches_nothing_off(client, trace_file, content):
    """JSON that is not a trace object, or a gzip stream damaged inside (zlib.error is no OSError)."""
    import gzip

    if content == "damaged deflate":
        data = bytearray(trace_file.read_bytes())
        data[12:40] = bytes(28)  # past the gzip header: the deflate blocks
        trace_file.write_bytes(bytes(data))
    else:
        trace_file.write_bytes(gzip.compress(content))
    for _ in range(http_guard.STRIKES + 1):
        r = client.get(URL)
        assert r.status_code == 409 and "cannot be read as a trace" in r.json()["error"], r.text
    assert http_guard.guard().ok("http") and client.get(names.ROUTE_CAPTURE + f"/{CID}").status_code == 200


def test_a_trace_file_too_large_to_merge_here_is_a_413(client, monkeypatch, trace_file):
    monkeypatch.setattr(http_capture, "TIMELINE_MAX_BYTES", trace_file.stat().st_size - 1)
    r = client.get(URL)
    assert r.status_code == 413 and "?format=trace" in r.json()["error"], r.text
    assert client.get(f"{names.ROUTE_CAPTURE}/{CID}?format=trace").status_code == 200


def test_a_full_read_gate_is_a_429_for_the_timeline(monkeypatch, trace_file):
    from sglang_ctxprof.views import http_gate

    class FullGate(http_gate.ReadGate):
        async def run(self, key, work, standing=False):
            raise http_gate.GateFull(self.limit, 1.0)

    monkeypatch.setattr(http_gate, "_GATE", FullGate(1.0))
    app = fastapi.FastAPI()
    http.install_routes(app, FakeChannel(str(trace_file)), admin=lambda f: f)
    r = TestClient(app, raise_server_exceptions=False).get(URL)
    assert r.status_code == 429 and r.json()["retry_after_s"] == 1.0, r.text


@pytest.mark.parametrize("steps", ["9" * 4000, "x" * 4000, "0", "-3"])
def test_a_bad_number_of_steps_is_a_short_400_that_asks_no_rank(client, steps):
    r = client.post(f"{names.ROUTE_CAPTURE}?steps={steps}")
    assert r.status_code == 400 and "steps must" in r.json()["error"], r.text[:200]
    assert len(r.text) < 300  # the value is not echoed whole


@pytest.mark.parametrize("wait", ["0", "-1", "nan", "inf", "3601", "x" * 4000])
def test_a_bad_wait_is_a_short_400_that_asks_no_rank(client, wait):
    r = client.post(f"{names.ROUTE_CAPTURE}?steps=2&wait_s={wait}")
    assert r.status_code == 400 and "wait_s must" in r.json()["error"], r.text[:200]
    assert len(r.text) < 300


class CancelChannel:
    """Every rank answers ``cancel`` as ``Capture.cancel`` does: its record, or None with a reason."""

    def __init__(self, answers: list[dict]):
        self.answers, self.asked = answers, []

    async def ask(self, cmd: str, **args):
        self.asked.append((cmd, args))
        return self.answers


def _cancel_client(monkeypatch, answers: list[dict]) -> tuple[TestClient, CancelChannel]:
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    ch, app = CancelChannel(answers), fastapi.FastAPI()
    http.install_routes(app, ch, admin=lambda f: f)
    return TestClient(app, raise_server_exceptions=False), ch


def test_cancel_asks_every_rank_and_answers_what_they_cancelled(monkeypatch):
    info = {"id": CID, "state": names.CAPTURE_FAILED, "cancelled": True}
    c, ch = _cancel_client(monkeypatch, [{"cancelled": info}, {"cancelled": info}])
    r = c.post(f"{names.ROUTE_CAPTURE_CANCEL}?id={CID}")
    assert r.status_code == 200 and r.json() == {"cancelled": [info, info]}, r.text
    assert ch.asked == [(names.CMD_CAPTURE, {"cancel": True, "id": CID})]
    r = c.post(names.ROUTE_CAPTURE_CANCEL)
    assert r.status_code == 200 and ch.asked[-1] == (names.CMD_CAPTURE, {"cancel": True})


def test_cancel_with_nothing_to_cancel_is_a_404_and_bad_input_a_400(monkeypatch):
    c, ch = _cancel_client(monkeypatch, [{"cancelled": None, "reason": "no capture is pending or running"}])
    r = c.post(names.ROUTE_CAPTURE_CANCEL)
    assert r.status_code == 404 and r.json() == {"error": "no capture is pending or running", "cancelled": []}, r.text
    for q in ("?id=bad%01id", "?id=" + "x" * 4000, "?color=red"):
        r = c.post(names.ROUTE_CAPTURE_CANCEL + q)
        assert r.status_code == 400 and len(r.text) < 300, (q, r.text[:200])
    assert len(ch.asked) == 1  # bad input asked no rank
