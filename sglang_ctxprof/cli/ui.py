"""``sglang-ctxprof ui --url URL``: open the server's live page (``/ctx_profile/ui``) in a browser.

Without a browser (a headless machine, or ``--no-browser``) it prints the address.  A server started
with ``--api-key`` protects the page like every read route, and a browser cannot send the key when it
navigates; with ``--api-key`` this command therefore serves a local forwarder on 127.0.0.1 that adds
the key to every ``/ctx_profile`` request (a request carrying its own key, such as the page's reset
with the admin key, keeps it) and opens the page through it, until Ctrl-C.
"""

from __future__ import annotations

import http.server
import urllib.error
import urllib.request
import webbrowser

from ..model import names


def add_cli_args(ap) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--api-key", default=None,
                    help="the server's --api-key: serve the page through a local forwarder that adds it")
    ap.add_argument("--port", type=int, default=0, help="local forwarder port with --api-key (default: any free)")
    ap.add_argument("--no-browser", action="store_true", help="only print the address")


def _forwarder(target: str, api_key: str, port: int) -> http.server.ThreadingHTTPServer:
    class Forward(http.server.BaseHTTPRequestHandler):
        def _go(self) -> None:
            if not self.path.startswith(names.ROUTE):
                self.send_error(404, "only /ctx_profile routes are forwarded")
                return
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            headers = {"Content-Type": self.headers.get("Content-Type") or "application/json",
                       "Authorization": self.headers.get("Authorization") or f"Bearer {api_key}"}
            req = urllib.request.Request(target + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    status, ctype, data = r.status, r.headers.get("Content-Type", ""), r.read()
            except urllib.error.HTTPError as exc:
                status, ctype, data = exc.code, exc.headers.get("Content-Type", ""), exc.read()
            except OSError as exc:
                self.send_error(502, f"cannot reach {target}: {exc}")
                return
            self.send_response(status)
            self.send_header("Content-Type", ctype or "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _go

        def log_message(self, *args) -> None:  # quiet
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), Forward)


def _open(address: str, no_browser: bool) -> None:
    opened = False
    if not no_browser:
        try:
            opened = webbrowser.get().open(address)
        except webbrowser.Error:
            opened = False
    print(f"{'opened' if opened else 'no browser available; open'} {address}")


def run(ns) -> int:
    from .client import ServerClient

    base = ns.url.rstrip("/")
    ServerClient(base, ns.api_key, timeout=30)._require(names.ROUTE_STATUS)  # a server with the profiler
    if not ns.api_key:
        _open(base + names.ROUTE_UI, ns.no_browser)
        return 0
    srv = _forwarder(base, ns.api_key, ns.port)
    _open(f"http://127.0.0.1:{srv.server_address[1]}{names.ROUTE_UI}", ns.no_browser)
    print(f"forwarding /ctx_profile to {base} with the api key; Ctrl-C to stop", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0
