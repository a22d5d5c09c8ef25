"""The CLI's HTTP client against small fake servers: what a per-request read may turn into "no
figures" (only a request the server's history no longer holds, or no profiler at all), and a
stream that is cut off."""

from __future__ import annotations


import pytest

from http_fakes import JsonHandler, Servers
from sglang_ctxprof.cli.client import ClientError, ServerClient
from sglang_ctxprof.model import names


class _Requests(JsonHandler):
    profiler = True

    def do_GET(self):
        rid = self.path.rsplit("/", 1)[-1]
        if not self.profiler:
            return self._json(404, {"detail": "Not Found"})  # no /ctx_profile routes at all
        if rid == "gone":
            return self._json(404, {"error": f"request {rid!r} not found in the recent-request ring"})
        if rid == "late":
            return self._json(504, {"error": "a scheduler has not answered the 'requests' command sent 5 s ago"})
        if rid == "broken":
            return self._json(500, {"error": "RuntimeError: boom", "degraded": []})
        return self._json(200, {"rid": rid, "steps": 3})

    def do_POST(self):  # a stream that stops without [DONE]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"meta_info": {"completion_tokens": 1}}\n\n')


@pytest.fixture()
def url():
    servers = Servers()
    yield lambda **attrs: servers.start(_Requests, **attrs)
    servers.close()


def test_only_a_request_the_server_does_not_hold_is_none(url):
    c = ServerClient(url(), timeout=30)
    assert c.profile_request("r1") == {"rid": "r1", "steps": 3}
    assert c.profile_request("gone") is None
    assert ServerClient(url(profiler=False), timeout=30).profile_request("r1") is None


@pytest.mark.parametrize("rid, code", [("late", "504"), ("broken", "500")])
def test_a_failed_per_request_read_raises(url, rid, code):
    with pytest.raises(ClientError, match=f"HTTP {code}"):
        ServerClient(url(), timeout=30).profile_request(rid)


def test_a_per_request_read_that_times_out_raises(url):
    import socket

    with socket.socket() as s:  # accepts, never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        c = ServerClient(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.2)
        with pytest.raises(ClientError, match="timed out"):
            c.profile_request("r1")


def test_a_stream_without_done_raises(url):
    chunks = []
    with pytest.raises(ClientError, match=r"\[DONE\]"):
        for chunk in ServerClient(url(), timeout=30).generate_stream([1, 2], 4):
            chunks.append(chunk)
    assert len(chunks) == 1


class _Keys(JsonHandler):
    """SGLang with --api-key K and --admin-api-key A: admin routes want A, the rest K."""

    def do_POST(self):
        want = "Bearer A" if self.path.startswith(names.ROUTE_RESET) else "Bearer K"
        if self.headers.get("Authorization", "") != want:
            return self._json(401, {"error": "Unauthorized"})
        return self._json(200, {"ok": True})


def test_the_sweeps_reset_carries_the_admin_key_and_everything_else_the_api_key():
    servers = Servers()
    try:
        base = servers.start(_Keys)
        c = ServerClient(base, "K", timeout=30, admin_key="A")
        assert c.profile_reset() and c.call("POST", "/generate", {}) == {"ok": True}
        with pytest.raises(ClientError, match="--admin-key"):  # the 401 names the option to give
            ServerClient(base, "K", timeout=30).profile_reset()
    finally:
        servers.close()
