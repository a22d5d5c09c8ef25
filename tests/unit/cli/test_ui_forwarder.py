"""``sglang-ctxprof ui --api-key``: the local forwarder lends the key to the page's reads only.

A real stdlib HTTP server stands in for a SGLang started with ``--api-key`` only: then SGLang's
``decide_request_auth`` accepts that key on ADMIN_OPTIONAL routes (reset/enable/disable) too, so a
forwarder that added it to a write would let any web page reset or disable profiling.  The stand-in
records what reaches it, so a refused request is proven never to have been forwarded.
"""

from __future__ import annotations

import http.client
import http.server
import threading

import pytest

from conftest import http as call
from sglang_ctxprof.cli.ui import _forwarder

API = "k-api"


class Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def _go(self) -> None:
        Upstream.seen.append((self.command, self.path))
        ok = self.headers.get("Authorization") == f"Bearer {API}"  # --api-key only: every level takes it
        body = b'{"ok": true, "path": "%s"}' % self.path.encode() if ok else b'{"error": "Unauthorized"}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _go

    def log_message(self, *a) -> None:
        pass


@pytest.fixture()
def fw():
    Upstream.seen = []
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    f = _forwarder(f"http://127.0.0.1:{up.server_address[1]}", API, 0)
    threading.Thread(target=f.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{f.server_address[1]}", f.server_address[1]
    finally:
        f.shutdown()
        up.shutdown()


def raw(port: int, method: str, path: str, headers: dict[str, str]) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, path, skip_host=True)
    for k, v in headers.items():
        c.putheader(k, v)
    c.putheader("Content-Length", "2")
    c.endheaders(b"{}")
    status = c.getresponse().status
    c.close()
    return status


def test_reads_get_the_key(fw):
    base, port = fw
    assert call("GET", base + "/ctx_profile/ui") == (200, {"ok": True, "path": "/ctx_profile/ui"})
    for path in ("/ctx_profile/ui/app.js", "/ctx_profile/requests?slowest=3", "/ctx_profile/requests/r-1",
                 "/ctx_profile/diagnosis", "/ctx_profile/status", "/ctx_profile?format=text",
                 "/ctx_profile/capture/cap-1?format=timeline"):  # the page's links to deep captures
        assert call("GET", base + path)[0] == 200, path
    assert call("GET", base + "/ctx_profile", headers={"Origin": base})[0] == 200  # the page itself
    page = {"Sec-Fetch-Site": "same-origin", "Referer": base + "/ctx_profile/ui"}  # the page's own fetches
    assert call("GET", base + "/ctx_profile/status", headers=page)[0] == 200
    assert call("GET", base + "/ctx_profile/ui", headers={"Sec-Fetch-Site": "none"})[0] == 200  # typed, or opened


def test_writes_never_get_the_lent_key(fw):
    base, port = fw
    for route in ("reset", "disable", "enable", "trace_policy", "fault", "capture?steps=4", "capture/cap-1"):
        assert call("POST", base + f"/ctx_profile/{route}", {})[0] == 403, route
    for method in ("PUT", "DELETE"):
        assert raw(port, method, "/ctx_profile/reset", {"Host": f"127.0.0.1:{port}"}) == 405
    assert call("GET", base + "/generate")[0] == 403  # only the profiler's read routes
    assert call("GET", base + "/ctx_profile/../generate")[0] == 403
    assert call("GET", base + "/ctx_profile/requests/a/b")[0] == 403
    assert call("GET", base + "/ctx_profile/capture")[0] == 403  # not a read route: only POST (admin) has it
    assert Upstream.seen == []
    # The page's reset with the key the user typed passes, with that key.
    assert call("POST", base + "/ctx_profile/reset", {}, headers={"Authorization": "Bearer typed"})[0] == 401
    assert Upstream.seen == [("POST", "/ctx_profile/reset")]


@pytest.mark.parametrize("headers", [
    {"Host": "evil.example"},  # DNS rebinding: the browser sends the attacker's name
    {"Host": "127.0.0.1:1"},
    {"Origin": "http://evil.example"},  # a web page's fetch or form post
    {"Origin": "null"},
    # a no-cors GET (an <img> or <script> of another page) carries no Origin: the browser says where from
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of this host is the same site, not the same origin
    {"Referer": "https://evil.example/page"},  # a browser that sends no Sec-Fetch-Site
    {"Referer": "http://127.0.0.1:1/page"},
    {"Referer": "http://[127.0.0.1/"},  # not a URL: refused, not a failed handler
])
def test_foreign_host_or_origin_is_refused(fw, headers):
    base, port = fw
    h = {"Host": f"127.0.0.1:{port}", **headers}
    assert raw(port, "GET", "/ctx_profile", h) == 403
    assert raw(port, "POST", "/ctx_profile/reset", {**h, "Authorization": "Bearer typed"}) == 403
    assert Upstream.seen == []


def _raw_cl(port: int, method: str, path: str, length: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, path, skip_host=True)
    c.putheader("Host", f"127.0.0.1:{port}")
    c.putheader("Authorization", "Bearer typed")
    c.putheader("Content-Length", length)
    c.endheaders()
    status = c.getresponse().status
    c.close()
    return status


def test_a_request_target_that_is_not_a_path_and_a_bad_length_are_refused(fw):
    """The upstream URL is the target plus the request's path: a target in absolute form (its scheme
    and host the caller's) would change the host the lent key goes to; a length that is not a plain
    number is a 400, not a handler crash or a read that waits for ever."""
    base, port = fw
    for target in ("a.evil.example://x/ctx_profile", "http://evil.example/ctx_profile", "ctx_profile"):
        assert raw(port, "GET", target, {"Host": f"127.0.0.1:{port}"}) in (400, 403), target
    for length in ("abc", "-1", "1e3", "9" * 5000):
        assert _raw_cl(port, "POST", "/ctx_profile/reset", length) == 400, length
    assert Upstream.seen == []


def test_a_path_no_url_carries_is_a_400(fw):
    """A path with a control or non-ASCII character cannot be forwarded as it is: a 400, never a
    dropped connection and a traceback."""
    import socket

    _, port = fw
    for path in (b"/ctx_profile/requests/a\x01b", "/ctx_profile/requests/\u00e9".encode()):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
            assert s.recv(64).startswith(b"HTTP/1.0 400"), path
    assert Upstream.seen == []
