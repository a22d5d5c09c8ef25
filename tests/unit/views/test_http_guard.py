"""``views.http_guard``: replies serialized inside the guard (non-finite floats as null, never a
bare 500) and cross-origin writes refused, on a real Starlette app through TestClient."""

from __future__ import annotations

import math

import pytest
from starlette.requests import Request

from sglang_ctxprof.control.client import NoAnswer
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.views import http_guard

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture()
def client(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    monkeypatch.setattr(http_guard, "_HOSTS", frozenset({"localhost", "testserver"}))  # the test client's name

    async def inf_reply(request: Request):
        return {"at": {"step_ms": math.inf, "tok_s": float("nan"), "ok": 1.5}, "rows": [(-math.inf, 2)]}

    async def write(request: Request):
        return {"ok": True}

    async def body(request: Request):
        got, bad = await http_guard.json_body(request, 8192, "a small JSON body")
        return bad if bad is not None else {"got": got}

    async def hung(request: Request):
        raise NoAnswer("no answer from every scheduler to 'status' within 30 s")

    app = fastapi.FastAPI()
    app.add_api_route("/hung", http_guard.guarded(hung), methods=["GET"])
    app.add_api_route("/body", http_guard.guarded(body), methods=["POST"])
    app.add_api_route("/inf", http_guard.guarded(inf_reply), methods=["GET"])
    app.add_api_route("/w", http_guard.guarded(write), methods=["POST", "GET"])
    return TestClient(app, raise_server_exceptions=False)


def test_non_finite_floats_are_null_not_a_500(client):
    r = client.get("/inf")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == {"at": {"step_ms": None, "tok_s": None, "ok": 1.5}, "rows": [[None, 2]]}
    assert http_guard.guard().status() is None


@pytest.mark.parametrize("origin,expect", [
    (None, 200), ("http://testserver", 200), ("https://testserver", 200),
    ("http://evil.example", 403), ("null", 403), ("http://testserver.evil.example", 403),
    ("http://testserver:81", 403), ("file://", 403)])
def test_writes_only_from_the_servers_own_origin(client, origin, expect):
    headers = {"Origin": origin} if origin else {}
    r = client.post("/w", content=b"{}", headers=headers)
    assert r.status_code == expect, r.text
    if expect == 403:
        assert "cross-origin" in r.json()["error"]
    assert client.get("/w", headers=headers).status_code == 200  # reads are not writes


@pytest.mark.parametrize("data, status", [
    (b"[" * 5000, 400),  # nests past the parser's recursion: RecursionError, not ValueError
    (b'{"mode": ' + b"[" * 40 + b'"slow"' + b"]" * 40 + b"}", 400),  # parses, but the command carrying it nests deeper
    (b'{"mode": "' + b"[" * 40 + b'"}', 200),  # brackets in a string are text
    (b'{"x": NaN}', 400),
    (b'{"x": -Infinity}', 400),
    (b"\xff\xfe", 400),
    (b"", 400),
    (b'{"x": "' + b"a" * 9000 + b'"}', 413),
    (b'{"\\ud800": 1}', 400),  # a lone surrogate: no UTF-8 carries it (SGLang's msgpack IPC fails on it)
    (b'{"x": ["\\udfff"]}', 400),
    (b'{"\xed\xa0\x80": 1}', 400),  # the same surrogate encoded in the bytes
    ('{"\ud800": 1}'.encode("utf-16-le", "surrogatepass"), 400),  # UTF-16, which json.loads on bytes takes
])
def test_a_bad_body_is_a_4xx_and_strikes_nothing(client, data, status):
    """A body is the client's: however it is wrong, a 4xx, and the guard counts no failure of ours."""
    for _ in range(http_guard.STRIKES + 1):
        r = client.post("/body", content=data)
        assert r.status_code == status, (data[:20], r.status_code, r.text[:200])
        assert r.json()["error" if status != 200 else "got"]
    assert http_guard.guard().ok("http") and http_guard._strikes == 0
    assert client.post("/body", content=b'{"x": [1, 2]}').json() == {"got": {"x": [1, 2]}}


def test_a_scheduler_that_does_not_answer_is_a_504_and_strikes_nothing(client):
    for _ in range(http_guard.STRIKES + 1):
        r = client.get("/hung")
        assert r.status_code == 504 and "within 30 s" in r.json()["error"]
    assert http_guard.guard().ok("http") and http_guard._strikes == 0


def test_a_client_that_hangs_up_mid_body_is_a_400_and_strikes_nothing(monkeypatch):
    """Starlette raises ``ClientDisconnect`` from the body stream when the client goes away: that is
    the client's doing (an upload cut short), not a failure of ours."""
    import asyncio

    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)

    async def body(request: Request):
        got, bad = await http_guard.json_body(request, 8192, "a small JSON body")
        return bad if bad is not None else {"got": got}

    endpoint = http_guard.guarded(body)

    async def post_cut_short():
        sent = iter([{"type": "http.request", "body": b'{"x": [1,', "more_body": True}, {"type": "http.disconnect"}])

        async def receive():
            return next(sent)

        scope = {"type": "http", "method": "POST", "path": "/body", "headers": [(b"content-length", b"100")],
                 "query_string": b""}
        return await endpoint(Request(scope, receive))

    for _ in range(http_guard.STRIKES + 1):
        r = asyncio.run(post_cut_short())
        assert r.status_code == 400 and b"disconnected" in r.body, r.body
    assert http_guard.guard().ok("http") and http_guard._strikes == 0


def test_one_failure_shared_by_several_readers_is_one_strike(client):
    """A read shared by its waiting readers hands each the one exception it raised: that failure
    counts once toward switching the routes off, however many readers shared it."""
    err = RuntimeError("one build failed")

    async def shared(request: Request):
        raise err

    app = fastapi.FastAPI()
    app.add_api_route("/shared", http_guard.guarded(shared), methods=["GET"])
    c = TestClient(app, raise_server_exceptions=False)
    for _ in range(http_guard.STRIKES + 1):
        assert c.get("/shared").status_code == 500
    assert http_guard.guard().ok("http") and http_guard._strikes == 1


def test_a_body_over_the_limit_is_refused_by_its_declared_length_or_as_it_streams(client):
    r = client.post("/body", content=b"1" * 8193, headers={"content-length": "8193"})
    assert r.status_code == 413 and "8193 bytes" in r.json()["error"]

    def chunks():  # no Content-Length: counted as it streams
        yield b"[1"
        for _ in range(5000):
            yield b",1"
        yield b"]"

    r = client.post("/body", content=chunks())
    assert r.status_code == 413, r.text


def test_a_large_body_is_parsed_on_the_build_thread_not_the_event_loop(monkeypatch):
    """The event loop also runs SGLang's tokenizer manager: a body of MBs (a plain reference may be
    4 MiB, a float callback per number) is parsed on the build thread; a small one where it arrives."""
    import threading

    threads = []
    finite = http_guard._finite

    def spy(text):
        threads.append(threading.current_thread().name)
        return finite(text)

    monkeypatch.setattr(http_guard, "_finite", spy)

    async def body(request: Request):
        got, bad = await http_guard.json_body(request, 1 << 22, "a JSON body")
        return bad if bad is not None else {"n": len(got)}

    app = fastapi.FastAPI()
    app.add_api_route("/body", http_guard.guarded(body), methods=["POST"])
    c = TestClient(app, raise_server_exceptions=False)
    assert c.post("/body", content=b"[" + b",".join([b"1.5"] * 50_000) + b"]").json() == {"n": 50_000}
    assert threads and all(t.startswith("ctxprof-build") for t in threads)
    threads.clear()
    assert c.post("/body", content=b"[1.5, 2.5]").json() == {"n": 2}
    assert threads and not any(t.startswith("ctxprof-build") for t in threads)


@pytest.mark.parametrize("host,expect", [
    ("evil.example:30000", 403),  # DNS rebinding: the attacker's name, resolved to this server
    ("127.0.0.1:30000", 200), ("[::1]:30000", 200), ("localhost:30000", 200), ("10.1.2.3", 200),
    ("testserver", 200),  # a name of this machine's, or one SGLANG_CTXPROF_ALLOWED_HOSTS adds
])
def test_a_same_origin_write_comes_through_an_address_or_a_name_of_this_server(client, host, expect):
    """A page whose name was rebound to this server's address is same-origin to it: its write's Host
    must also be an IP address, localhost, a name of this machine or one the operator allowed."""
    r = client.post("/w", content=b"{}", headers={"Host": host, "Origin": f"http://{host}"})
    assert r.status_code == expect, r.text
    if expect == 403:
        assert "SGLANG_CTXPROF_ALLOWED_HOSTS" in r.json()["error"]
    assert client.post("/w", content=b"{}", headers={"Host": host}).status_code == 200  # no Origin: curl, the CLI


def test_the_hosts_a_write_may_name_are_this_machines_and_the_allowed_ones(monkeypatch):
    import socket

    monkeypatch.setattr(http_guard, "_HOSTS", None)
    monkeypatch.setenv("SGLANG_CTXPROF_ALLOWED_HOSTS", " Gpu-Box.example , other ")
    assert http_guard.own_hosts() >= {"localhost", socket.gethostname().lower(), "gpu-box.example", "other"}


@pytest.mark.parametrize("declared, status", [("\u00b2", None), ("9" * 5000, 413), ("12", None)])
def test_an_odd_declared_length_never_raises(declared, status):
    """Content-Length is the client's: a digit no int() reads, or thousands of digits, is no failure
    of ours (the body is read and checked as it streams)."""
    import asyncio

    async def run():
        sent = iter([{"type": "http.request", "body": b'{"x": 1}', "more_body": False}])

        async def receive():
            return next(sent)

        scope = {"type": "http", "method": "POST", "path": "/b", "headers": [
            (b"content-length", declared.encode("latin-1"))], "query_string": b""}
        return await http_guard.json_body(Request(scope, receive), 8192, "a small JSON body")

    got, bad = asyncio.run(run())
    assert (bad.status_code if bad is not None else None) == status
    assert status is not None or got == {"x": 1}


def test_the_nesting_scan_reads_only_text_the_parser_took(monkeypatch):
    """The string pattern that skips strings for the nesting count rescans the rest of the text from
    every quote inside an unterminated string (32 kB of them took seconds): it runs only once the
    parser has taken the body, whose strings are all closed."""
    seen = []
    real = http_guard._STRINGS

    class Spy:
        def sub(self, repl, text):
            seen.append(text)
            return real.sub(repl, text)

    monkeypatch.setattr(http_guard, "_STRINGS", Spy())
    with pytest.raises(ValueError):
        http_guard._parse(b'{"x": "' + b'\\"' * 20 + b"}")
    assert seen == []
    assert http_guard._parse(b'{"x": ["[{"]}') == {"x": ["[{"]} and len(seen) == 1
