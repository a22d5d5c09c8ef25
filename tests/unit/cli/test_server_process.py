"""``ServerProcess.ready()`` against a fake SGLang HTTP front: once ``/v1/models`` lists a model, a
server started with ``--skip-server-warmup`` is sent SGLang's ``POST /freeze_gc`` (which SGLang's
own warm-up thread may have lost to uvicorn's bind), with the admin key where one is given."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_ctxprof.cli.server import ServerProcess


class _Front(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []
    freeze_status = 200

    def log_message(self, *a) -> None:
        pass

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    api_key = ""  # SGLang's --api-key: every route wants it

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, self.headers.get("Authorization", "")))
        if self.api_key and self.headers.get("Authorization", "") != f"Bearer {self.api_key}":
            return self._reply(401, b'{"error": "Unauthorized"}')
        self._reply(200, json.dumps({"data": [{"id": "m"}]}).encode() if self.path == "/v1/models" else b"{}")

    def do_POST(self) -> None:
        self.seen.append(("POST", self.path, self.headers.get("Authorization", "")))
        self._reply(self.freeze_status if self.path == "/freeze_gc" else 404, b"{}")


@pytest.fixture
def front():
    _Front.seen = []
    _Front.freeze_status = 200
    _Front.api_key = ""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Front)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _ready(port: int, args: list[str], **kw: bool) -> ServerProcess:
    """A ServerProcess on ``port`` (the fake front) taken through ``ready()``; ``kw`` go to it
    (``freeze_gc``)."""
    sp = ServerProcess(args, port=port, timeout=20, **kw)
    sp.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for SGLang
    sp._t0 = __import__("time").time()
    try:
        sp.ready()
    finally:
        sp.proc.kill()
        sp.proc.wait()
    return sp


def test_a_server_with_an_api_key_is_probed_with_it(front):
    """``sweep --launch`` with ``--api-key`` in SGLang's arguments: the readiness probe is a route the
    key guards (without it every probe was a 401 until the start-up timeout)."""
    _Front.api_key = "k"
    _ready(front, ["--model-path", "m", "--api-key", "k"])
    assert ("GET", "/v1/models", "Bearer k") in _Front.seen


def test_skip_warmup_server_is_frozen_once_ready(front):
    sp = _ready(front, ["--model-path", "m", "--skip-server-warmup", "--admin-api-key", "adm"])
    posts = [s for s in _Front.seen if s[0] == "POST"]
    assert posts == [("POST", "/freeze_gc", "Bearer adm")]
    assert sp.gc_frozen is True
    # after the server answered its models: the freeze is of a ready server
    assert _Front.seen.index(posts[0]) > max(i for i, s in enumerate(_Front.seen) if s[1] == "/v1/models")


def test_warmed_server_is_left_to_sglang(front):
    sp = _ready(front, ["--model-path", "m"])
    assert [s for s in _Front.seen if s[0] == "POST"] == []
    assert sp.gc_frozen is None


def test_refused_freeze_is_reported_not_raised(front):
    _Front.freeze_status = 403
    sp = _ready(front, ["--model-path", "m", "--skip-server-warmup", "--api-key", "k"])
    assert [s for s in _Front.seen if s[0] == "POST"] == [("POST", "/freeze_gc", "Bearer k")]
    assert sp.gc_frozen is False


def test_freeze_can_be_left_to_sglang(front):
    sp = _ready(front, ["--model-path", "m", "--skip-server-warmup"], freeze_gc=False)
    assert [s for s in _Front.seen if s[0] == "POST"] == [] and sp.gc_frozen is None


def test_free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice():
    """A server binds its port only after loading its model (seconds to minutes).  A port the kernel
    hands out for ``bind(0)`` lies in its ephemeral range, which every outgoing connection meanwhile
    draws from (the readiness polls, SGLang's own): the demo's spec server once failed to start with
    'address already in use'.  ``free_port`` picks below that range and below SGLang's own
    later-bound ports (22000-29999), never the same port twice in a process (two servers start side
    by side), and each one is free when handed out."""
    import socket

    from sglang_ctxprof.cli import server

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    ports = [server.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if ephemeral_low > server.PORT_LOW:  # else there is no room below it: the kernel's pick
        assert all(server.PORT_LOW <= p <= min(server.PORT_HIGH, ephemeral_low - 1) for p in ports), ports
        assert server.PORT_HIGH < 22000
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free: nothing took it


def test_stop_kills_the_group_after_its_launcher_has_exited_and_been_reaped(tmp_path):
    """SGLang's launcher may exit before its scheduler does; once ``poll()`` has reaped it, its pid
    names no process, but its group (its own session) still holds the children: stop kills them."""
    import os
    import sys
    import time

    pidfile = tmp_path / "child.pid"
    sp = ServerProcess([], port=1, timeout=5)
    sp.cmd = [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen(['sleep', '60']); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))"]
    sp.spawn()
    sp.proc.wait(timeout=20)  # the launcher exits, its child lives on in the group
    assert not sp.alive()  # reaped
    child = int(pidfile.read_text())
    os.kill(child, 0)  # alive
    sp.stop(timeout=1)
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # killed, not reaped yet (a zombie): gone
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the launcher's child survived stop()")
