"""``sglang-ctxprof ui --api-key``: the local forwarder adds the key to /ctx_profile requests only,
and keeps a request's own key (the page's reset with the admin key).  A real stdlib HTTP server
stands in for SGLang's auth (bearer token compared like ``decide_request_auth``)."""

from __future__ import annotations

import http.server
import threading

from conftest import http as call
from sglang_ctxprof.cli.ui import _forwarder

API, ADMIN = "k-api", "k-admin"


class Upstream(http.server.BaseHTTPRequestHandler):
    def _go(self) -> None:
        auth = self.headers.get("Authorization")
        want = ADMIN if self.command == "POST" else API
        ok = auth == f"Bearer {want}"
        body = b'{"ok": true, "path": "%s"}' % self.path.encode() if ok else b'{"error": "Unauthorized"}'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _go

    def log_message(self, *a) -> None:
        pass


def test_forwarder_adds_the_key_and_keeps_a_given_one():
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    fw = _forwarder(f"http://127.0.0.1:{up.server_address[1]}", API, 0)
    threading.Thread(target=fw.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{fw.server_address[1]}"
    try:
        assert call("GET", base + "/ctx_profile/ui") == (200, {"ok": True, "path": "/ctx_profile/ui"})
        assert call("GET", base + "/ctx_profile/requests?slowest=3")[0] == 200
        assert call("POST", base + "/ctx_profile/reset", {})[0] == 401  # the api key is not the admin key
        assert call("POST", base + "/ctx_profile/reset", {}, headers={"Authorization": f"Bearer {ADMIN}"})[0] == 200
        assert call("GET", base + "/generate")[0] == 404  # only the profiler's routes are forwarded
    finally:
        fw.shutdown()
        up.shutdown()
