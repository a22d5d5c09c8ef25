"""Bad input, against a real CPU server (tiny DeepSeek-V3 + EAGLE, profiling on).

Every ``/ctx_profile`` route answers wrong parameters, out-of-range values, unknown formats, wrong
methods, a huge ``slowest=N`` and malformed rids with a 4xx and a JSON error, and the server keeps
generating.  Then hypothesis fuzzes methods, paths, query parameters and bodies: never a 5xx.  The
server carries its control replies over SGLang's msgpack IPC (``SGLANG_USE_PICKLE_IPC=0``), the
stricter of its two: a reply that cannot be encoded there (a lone surrogate) would stop the scheduler.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxprof_ref
from conftest import generate, http, make_server_fixture, rand_ids
from sglang_ctxprof.model import names, rids

pytestmark = pytest.mark.server

server = make_server_fixture("bad-input", lambda: ctxprof_ref.model_args() + [names.CLI_FLAG],
                             env={"SGLANG_USE_PICKLE_IPC": "0"})
R = names.ROUTE


def raw(method: str, url: str, data: bytes | None = None, ctype: str = "application/json",
        timeout: float = 120):
    """(status, body bytes, content type) without following redirects or raising."""
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype})
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("content-type", "")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def assert_json_4xx(status: int, body: bytes, ctype: str, what: str) -> dict:
    assert 400 <= status < 500, (what, status, body[:300])
    assert "json" in ctype, (what, ctype)
    doc = json.loads(body)
    msg = doc.get("error") or doc.get("detail")
    assert msg, (what, doc)
    return doc


@pytest.fixture(scope="module")
def warm(server):
    """A few requests so the profile and the request ring have content."""
    out = generate(server.url, rand_ids(200, seed=3), max_new_tokens=12)
    return out["meta_info"]["id"]


BAD_GETS = [
    (f"{R}?format=xml", "unknown format"),
    (f"{R}?format=", "unknown format"),
    (f"{R}?format=JSON", "unknown format"),
    (f"{R}?foo=1", "unknown query"),
    (f"{R}?format=json&slowest=3", "unknown query"),
    (f"{R}/requests?slowest=abc", "must be an integer"),
    (f"{R}/requests?slowest=", "must be an integer"),
    (f"{R}/requests?slowest=1.5", "must be an integer"),
    (f"{R}/requests?slowest=1e3", "must be an integer"),
    (f"{R}/requests?slowest=0", "between"),
    (f"{R}/requests?slowest=-4", "between"),
    (f"{R}/requests?slowest=1001", "between"),
    (f"{R}/requests?slowest=" + "9" * 30, "between"),
    (f"{R}/requests?slowest=" + "9" * 5000, "must be an integer"),
    (f"{R}/requests?limit=3", "unknown query"),
    (f"{R}/status?verbose=1", "no query"),
    (f"{R}/requests/" + urllib.parse.quote("a b"), "not found"),  # SGLang takes any text as a rid
    (f"{R}/requests/" + "x" * 257, "malformed rid"),
    (f"{R}/requests/" + urllib.parse.quote("é"), "not found"),
    (f"{R}/requests/" + urllib.parse.quote("<script>"), "not found"),
    (f"{R}/requests/%00", "malformed rid"),
    (f"{R}/requests?rid=%1b%5B2J", "malformed rid"),
    (f"{R}/requests/no-such-request", "not found"),
    (f"{R}/nope", "Not Found"),
]


@pytest.mark.parametrize("path,expect", BAD_GETS, ids=[p[:60] for p, _ in BAD_GETS])
def test_bad_get_is_a_clear_4xx(server, warm, path, expect):
    status, body, ctype = raw("GET", server.url + path)
    doc = assert_json_4xx(status, body, ctype, path)
    assert expect.lower() in json.dumps(doc).lower(), doc


WRONG_METHODS = [
    ("POST", R), ("DELETE", R), ("PUT", R), ("PATCH", f"{R}/requests"), ("POST", f"{R}/status"),
    ("GET", f"{R}/reset"), ("GET", f"{R}/enable"), ("DELETE", f"{R}/disable"), ("PUT", f"{R}/reset"),
    ("POST", f"{R}/requests/abc"),
]


@pytest.mark.parametrize("method,path", WRONG_METHODS)
def test_wrong_method_is_405_json(server, warm, method, path):
    status, body, ctype = raw(method, server.url + path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
    assert status == 405, (method, path, status, body[:200])
    assert_json_4xx(status, body, ctype, f"{method} {path}")


def test_command_with_params_is_400(server, warm):
    for cmd in ("reset", "enable", "disable"):
        status, body, ctype = raw("POST", f"{server.url}{R}/{cmd}?now=1", b"{}")
        assert_json_4xx(status, body, ctype, cmd)


def test_fault_switch_is_absent_in_production(server, warm):
    status, body, ctype = raw("POST", f"{server.url}{R}/fault", b'{"component": "hooks"}')
    assert status in (404, 405), status
    assert http("GET", server.url + R)[1]["degraded"] is None


def test_good_requests_still_work_after_bad_ones(server, warm):
    status, body = http("GET", f"{server.url}{R}/requests?slowest=1000")
    assert status == 200 and isinstance(body["requests"], list)
    status, r = http("GET", f"{server.url}{R}/requests/{warm}")
    assert status == 200 and r["rid"] == warm
    assert set(r) >= {"rid", "steps", "accepted", "committed", "step_rows"}
    out = generate(server.url, rand_ids(100, seed=9), max_new_tokens=8)
    assert out["meta_info"]["completion_tokens"] == 8
    status, body = http("GET", server.url + R)
    assert status == 200 and body["degraded"] is None and body["dropped"] == 0


def test_profile_never_returns_text(server, warm):
    """Only ids, lengths and timings: the prompt/output text of a request is in no response."""
    marker = "zebracornflakes"
    status, out = http("POST", server.url + "/generate", {
        "text": f"{marker} {marker} {marker}",
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
    assert status == 200, out
    rid = out["meta_info"]["id"]
    bodies = [raw("GET", server.url + p)[1].decode(errors="replace") for p in (
        R, f"{R}?format=text", f"{R}?format=prometheus", f"{R}/requests?slowest=1000",
        f"{R}/requests/{rid}", f"{R}/status")]
    assert rid in bodies[4]
    for b in bodies:
        assert marker not in b
        if len(out["text"].strip()) >= 12:  # long enough not to occur by chance
            assert out["text"] not in b


# ---------------------------------------------------------------------------------------- fuzz
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_params = st.dictionaries(st.sampled_from(["format", "slowest", "rid", "x", "n"]) | _text,
                          st.sampled_from(["json", "text", "prometheus", "10", "0", "-1", "1000", "1001"])
                          | st.integers(-10**30, 10**30).map(str) | _text, max_size=3)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3), max_leaves=8)
_body = st.none() | _json.map(lambda j: json.dumps(j).encode()) | st.binary(max_size=64)
_path = (st.sampled_from([R, f"{R}/reset", f"{R}/enable", f"{R}/disable", f"{R}/status", f"{R}/requests",
                          f"{R}/fault", f"{R}/"])
         | _text.map(lambda t: f"{R}/requests/" + urllib.parse.quote(t, safe="")))
_method = st.sampled_from(["GET", "GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH"])


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(method=_method, path=_path, params=_params, body=_body)
def _fuzz_once(url, method, path, params, body):
    q = urllib.parse.urlencode(params)
    full = url + path + (("?" + q) if q else "")
    data = body if method in ("POST", "PUT", "PATCH") else None
    status, out, ctype = raw(method, full, data)
    assert status < 500, (method, full, data, status, out[:300])
    if status >= 400:
        assert "json" in ctype, (method, full, status, ctype)


def test_fuzz_no_5xx(server, warm):
    _fuzz_once(server.url)
    assert http("POST", server.url + R + "/enable")[0] == 200  # the fuzz may have disabled profiling
    out = generate(server.url, rand_ids(64, seed=11), max_new_tokens=5)
    assert out["meta_info"]["completion_tokens"] == 5
    status, body = http("GET", server.url + R)
    assert status == 200 and body["degraded"] is None


# ------------------------------------------------------------------ one bad query, the API stays up
def test_overflowing_whatif_ctx_is_a_4xx_and_switches_nothing_off(server, warm):
    """A 320-digit ``ctx`` used to raise OverflowError in the diagnosis and disable every route."""
    for value in ("9" * 320, "1" + "0" * 308, str(names.MAX_WHATIF_CTX + 1)):
        status, body, ctype = raw("GET", f"{server.url}{R}/diagnosis?ctx={value}")
        assert_json_4xx(status, body, ctype, f"ctx={value[:10]}")
    status, body, _ = raw("GET", f"{server.url}{R}/diagnosis?ctx={names.MAX_WHATIF_CTX}")
    assert status == 200, body[:300]
    doc = json.loads(body)
    assert doc["whatif"]["at"]["ctx"] == names.MAX_WHATIF_CTX
    for path in (R, f"{R}/status", f"{R}/requests?slowest=2", f"{R}/diagnosis"):
        assert http("GET", server.url + path)[0] == 200, path


def test_huge_number_in_the_trace_policy_is_a_4xx(server, warm):
    for field in ("slow_tok_s", "slow_step_ms"):
        status, body, ctype = raw("POST", f"{server.url}{R}/trace_policy",
                                  b'{"%s": 1%s}' % (field.encode(), b"0" * 400))
        assert_json_4xx(status, body, ctype, field)
        assert len(body) < 1000, body[:200]
    status, body = http("GET", f"{server.url}{R}/trace_policy")
    assert status == 200 and body["trace_policy"]["slow_tok_s"] < 1e300, body


def test_malformed_bodies_are_4xx_and_switch_nothing_off(server, warm):
    """Bodies past the JSON parser's nesting, with NaN, of the wrong field types, or too large: a
    4xx each, however many in a row (three 500s in a row used to switch every route off)."""
    profile = http("GET", server.url + R)[1]
    plainish = [{**b, "phases": {k: v for k, v in b["phases"].items() if k not in ("verify", "draft")}}
                for b in profile["buckets"]]  # passes the plain check, then a field of the wrong type:
    robust_x = {**profile, "algorithms": [], "buckets": [{**b, "robust": "x"} for b in plainish]}
    # a field only the ledger reads against this server's speculative steps (accepted, then every
    # /diagnosis failed), and a time that is not a finite number
    gap_x = {**profile, "algorithms": [], "buckets": plainish, "host": {"between_steps": {"count": 1, "p50_ms": "x"}}}
    nan_ms = {**profile, "algorithms": [], "buckets": [
        {**b, "robust": None, "phases": {k: {**v, "mean_ms": "nan", "p50_ms": "nan"} for k, v in b["phases"].items()}}
        for b in plainish]}
    # nested just short of the parser's limit: parsed, then the control command carrying it nested
    # deeper still made json.dumps recurse past Python's limit (a 500, and four switched the API off)
    deep = [(f"{R}/trace_policy", b'{"mode": ' + b"[" * d + b'"slow"' + b"]" * d + b"}", 400) for d in range(948, 962)]
    cases = deep + [(f"{R}/trace_policy", b"[" * 3000, 400), (f"{R}/plain", b"[" * 100_000, 400),
             (f"{R}/trace_policy", b'{"slow_tok_s": NaN}', 400), (f"{R}/plain", json.dumps(robust_x).encode(), 400),
             (f"{R}/plain", json.dumps(gap_x).encode(), 400), (f"{R}/plain", json.dumps(nan_ms).encode(), 400),
             (f"{R}/trace_policy", b'{"slow_tok_s": 1e999}', 400),
             (f"{R}/trace_policy", b'{"mode": "' + b"a" * 10_000 + b'"}', 413),
             (f"{R}/trace_policy", b'{"\\ud800": 1}', 400), (f"{R}/trace_policy", b'{"\xed\xa0\x80": 1}', 400)]
    for path, data, want in cases:
        for _ in range(4):
            status, body, ctype = raw("POST", server.url + path, data)
            assert status == want, (path, data[:20], status, body[:300])
            assert_json_4xx(status, body, ctype, path)
    for _ in range(4):  # a client that hangs up mid-upload
        host, port = server.url.split("//")[1].split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"POST {R}/plain HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: 100000\r\n\r\n".encode() + b'{"buckets": [')
        time.sleep(0.2)
    for path in (R, f"{R}/status", f"{R}/diagnosis", f"{R}/diagnosis", f"{R}/diagnosis", f"{R}/plain"):
        status, body = http("GET", server.url + path)
        assert status == 200, (path, body)
    assert http("GET", server.url + R)[1]["degraded"] is None
    assert http("GET", f"{server.url}{R}/plain")[1]["registered"] is False


def test_cross_origin_writes_are_refused(server, warm):
    """SGLang allows CORS from any origin; without a key a page could post reset/disable."""
    before = http("GET", server.url + R)[1]["totals"]["decode_steps"]
    policy = http("GET", f"{server.url}{R}/trace_policy")[1]["trace_policy"]
    assert before > 0 and policy["mode"] != "all"
    for origin in ("http://evil.example", "null", server.url + ".evil.example"):
        for route in ("reset", "disable", "trace_policy"):
            req = urllib.request.Request(f"{server.url}{R}/{route}", data=b'{"mode": "all"}', method="POST",
                                         headers={"Content-Type": "text/plain", "Origin": origin})
            try:
                urllib.request.urlopen(req, timeout=60)
                status = 200
            except urllib.error.HTTPError as exc:
                status = exc.code
            assert status == 403, (origin, route, status)
    body = http("GET", server.url + R)[1]
    assert body["enabled"] is True and body["totals"]["decode_steps"] >= before
    assert http("GET", f"{server.url}{R}/trace_policy")[1]["trace_policy"] == policy
    status, _ = http("POST", f"{server.url}{R}/enable", {}, headers={"Origin": server.url})
    assert status == 200  # the server's own origin (its page) may write


# ------------------------------------------------------------------------------- client-chosen rids
def _generate_rid(url: str, rid: str, n: int = 3) -> dict:
    status, out = http("POST", url + "/generate", {
        "input_ids": rand_ids(40, seed=len(rid) % 97), "rid": rid,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert status == 200, str(out)[:300]
    return out


def test_megabyte_rids_are_capped_everywhere(server, warm):
    """20 rids of 1 MB: what the ranks keep and the read routes ship is capped (prefix + digest)."""
    keep = rids.RID_KEEP + 2 + 16
    longs = [f"big{i:02d}-" + "x" * (1 << 20) for i in range(20)]
    for rid in longs:
        assert _generate_rid(server.url, rid)["meta_info"]["completion_tokens"] == 3
    status, body, _ = raw("GET", f"{server.url}{R}/requests?slowest=1000")
    assert status == 200 and len(body) < (1 << 20), len(body)  # was > 20 MB
    shown = {r["rid"] for r in json.loads(body)["requests"]}
    assert {rids.short_rid(r) for r in longs} <= shown
    assert max(len(r) for r in shown) <= keep
    status, body, _ = raw("GET", f"{server.url}{R}/trace.json?last=2048")
    assert status == 200 and len(body) < (4 << 20), len(body)
    # A rid the routes accept (<= 256 characters) but longer than what is kept: found by its full form.
    mid = "m" * 200
    _generate_rid(server.url, mid)
    status, r = http("GET", f"{server.url}{R}/requests/{mid}")
    assert status == 200 and r["rid"] == rids.short_rid(mid) and r["steps"] > 0, r


def test_cli_prints_a_hostile_rid_escaped(server, warm):
    evil = "evil\x1b[2J\x1b]0;owned\x07\nrow\u202e"
    _generate_rid(server.url, evil)
    p = subprocess.run([sys.executable, "-m", "sglang_ctxprof.cli.main", "trace", "--slowest", "1000",
                        "--url", server.url], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "evil" in p.stdout
    for ch in ("\x1b", "\x07", "\u202e"):
        assert ch not in p.stdout, repr(ch)
    assert "request evil\\x1b[2J\\x1b]0;owned\\x07\\nrow\\u202e" in p.stdout


def test_a_client_filling_the_read_queue_leaves_the_standing_reads_served(server, warm):
    """A client keeps distinct ``/diagnosis?ctx=N`` reads waiting (every place in the read queue taken,
    the rest refused with 429) while a dashboard reads ``/ctx_profile``: it is answered (200), and
    before reads that were waiting when it came, not after all of them."""
    import itertools
    import threading

    done: list[tuple[float, float, int]] = []  # (sent, answered, status) of each flood read
    stop, n = threading.Event(), itertools.count(1)

    def flood() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            status, _, _ = raw("GET", f"{server.url}{R}/diagnosis?ctx={next(n)}")
            done.append((sent, time.monotonic(), status))
            if status == 429:
                time.sleep(0.005)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(24)]  # more than the places
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while not any(s == 429 for _, _, s in done) and time.monotonic() < deadline:
        time.sleep(0.01)  # the queue is full once a read is refused
    sent = time.monotonic()
    status, body, _ = raw("GET", f"{server.url}{R}")
    answered = time.monotonic()
    stop.set()
    for t in threads:
        t.join(300)
    print(f"flood: {sum(s == 200 for _, _, s in done)} read, {sum(s == 429 for _, _, s in done)} refused; "
          f"standing read {status} in {answered - sent:.2f} s, ahead of "
          f"{sum(1 for d in done if d[2] == 200 and d[0] < sent and d[1] > answered)} queued before it")
    assert any(s == 429 for _, _, s in done), "the flood never filled the read queue"
    assert status == 200, (status, body[:300])
    overtaken = [d for d in done if d[2] == 200 and d[0] < sent and d[1] > answered]
    assert overtaken, "the standing read waited behind every read queued before it"
    assert raw("GET", f"{server.url}{R}/diagnosis")[0] == 200  # the queue drained; reads go on
