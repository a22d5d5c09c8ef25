"""``sglang-ctxprof ui --url URL``: open the server's live page (``/ctx_profile/ui``) in a browser.

Without a browser (a headless machine, or ``--no-browser``) it prints the address.  A server started
with ``--api-key`` protects the page like every read route, and a browser cannot send the key when it
navigates; with ``--api-key`` this command therefore serves a local forwarder on 127.0.0.1 and opens
the page through it, until Ctrl-C.

The forwarder lends the key to reads only: ``GET`` of the page, its files and the read routes
(:data:`READ_ROUTES`, and under :data:`PREFIX_ROUTES` one request or one deep capture, which the
page links to).  A write (the page's reset) passes only with the caller's own
``Authorization`` (the admin key the user typed), never with the lent key; any other method or path is
refused.  A request whose ``Host`` is not the forwarder's own address (DNS rebinding), or that says
it came from anywhere but the forwarder's own page (``Origin``: a web page's form post or fetch;
``Sec-Fetch-Site`` or ``Referer``: also an ``<img>`` or ``<script>`` of another page, which sends no
``Origin``), gets 403 before anything is forwarded.
"""

from __future__ import annotations

import http.server
import urllib.error
import urllib.parse
import urllib.request
import webbrowser

from ..model import names

READ_ROUTES = (names.ROUTE, names.ROUTE_STATUS, names.ROUTE_REQUESTS, names.ROUTE_DIAGNOSIS,
               names.ROUTE_TRACE_JSON, names.ROUTE_TRACE_POLICY, names.ROUTE_UI)
PREFIX_ROUTES = (names.ROUTE_REQUESTS + "/", names.ROUTE_UI + "/", names.ROUTE_CAPTURE + "/")
WRITE_ROUTES = (names.ROUTE_RESET,)
LOCAL_HOSTS = ("127.0.0.1", "localhost")
MAX_FORWARDED_BODY = 65536  # bytes of a forwarded write's body (the page's writes send a few)


def _route_ok(path: str, routes: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> bool:
    if not path.startswith("/"):  # a target in absolute form would name the upstream host itself
        return False
    p = urllib.parse.urlsplit(path).path
    if ".." in urllib.parse.unquote(p) or "//" in p:
        return False
    return p in routes or any(p.startswith(x) and "/" not in p[len(x):] and len(p) > len(x) for x in prefixes)


def add_cli_args(ap) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--api-key", default=None,
                    help="the server's --api-key: serve the page through a local forwarder that adds it")
    ap.add_argument("--port", type=int, default=0, help="local forwarder port with --api-key (default: any free)")
    ap.add_argument("--no-browser", action="store_true", help="only print the address")


def _forwarder(target: str, api_key: str, port: int) -> http.server.ThreadingHTTPServer:
    class Forward(http.server.BaseHTTPRequestHandler):
        def _local(self) -> bool:
            """Host is this forwarder's own address, and where the request came from (when the
            client says) is this forwarder: ``Origin``; ``Sec-Fetch-Site`` (a browser sends it with
            no-cors GETs too, an ``<img>`` of another page, which carry no ``Origin``): the same
            origin or none (an address typed or opened); ``Referer``, for a browser without it."""
            own = {f"{h}:{self.server.server_address[1]}" for h in LOCAL_HOSTS}
            if (self.headers.get("Host") or "").lower() not in own:
                return False
            origins = {f"http://{h}" for h in own}
            origin, site = self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site")
            if origin is not None and origin.lower() not in origins:
                return False
            if site is not None and site.lower() not in ("same-origin", "none"):
                return False
            referer = self.headers.get("Referer")
            if referer is not None:
                try:
                    parts = urllib.parse.urlsplit(referer)
                except ValueError:  # not a URL (an unclosed "[" host)
                    return False
                return f"{parts.scheme}://{parts.netloc}".lower() in origins
            return True

        def _go(self) -> None:
            if not self._local():
                self.send_error(403, "foreign Host or Origin: this forwarder serves only its own page")
                return
            if not (self.path.isascii() and self.path.isprintable()):
                self.send_error(400, "the path must be printable ASCII (percent-encode the rest)")
                return
            if self.command == "GET" and _route_ok(self.path, READ_ROUTES, PREFIX_ROUTES):
                auth = self.headers.get("Authorization") or f"Bearer {api_key}"
            elif self.command == "POST" and _route_ok(self.path, WRITE_ROUTES) and self.headers.get("Authorization"):
                auth = self.headers["Authorization"]  # the caller's own key; the lent key never writes
            else:
                self.send_error(403 if self.command in ("GET", "POST") else 405,
                                "only the page's reads (GET) and a write with its own key are forwarded")
                return
            length = self.headers.get("Content-Length") or "0"
            if not (length.isascii() and length.isdigit()) or len(length) > 18 or int(length) > MAX_FORWARDED_BODY:
                self.send_error(400, f"Content-Length must be a number of bytes up to {MAX_FORWARDED_BODY}")
                return
            n = int(length)
            body = self.rfile.read(n) if n else None
            headers = {"Content-Type": self.headers.get("Content-Type") or "application/json", "Authorization": auth}
            req = urllib.request.Request(target + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    status, ctype, data = r.status, r.headers.get("Content-Type", ""), r.read()
            except urllib.error.HTTPError as exc:
                status, ctype, data = exc.code, exc.headers.get("Content-Type", ""), exc.read()
            except OSError as exc:
                self.send_error(502, f"cannot reach {target}: {exc}")
                return
            except ValueError as exc:  # a URL urllib will not send (http.client.InvalidURL)
                self.send_error(400, f"cannot forward this path: {type(exc).__name__}")
                return
            self.send_response(status)
            self.send_header("Content-Type", ctype or "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _go

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
