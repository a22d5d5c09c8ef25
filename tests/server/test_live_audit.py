"""The live self-audit on a real CPU server (tiny DeepSeek-V3 + EAGLE, MoE, greedy).

A soak of 32 mixed requests (prompt lengths 40..1590, 1 to 96 new tokens, some streamed, some
abandoned mid-stream by their client) must leave every invariant counter at 0, while the audit checked
every step and every finished request.  Then the test-only fault plugin (tests/plugins/ctxprof_fault)
breaks one invariant at a time, and each fault must raise its own counter - in /ctx_profile/status,
in SGLang's /metrics (``--enable-metrics``) and in ``?format=prometheus`` - and no other, and the
diagnosis must flag it.  Last, a stalled record sink (the plugin's ``stall_sink``) stalls neither
requests nor reads: the sinks run on the drain thread only, outside the aggregator's lock.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import tempfile
import time
import uuid
from http.client import HTTPConnection
from typing import Callable

import pytest

import ctxprof_ref
from conftest import ROOT, generate, http, path_loaded, rand_ids, start_server
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

FAULT_PLUGIN = ROOT / "tests" / "plugins" / "ctxprof_fault"
CONTROL_TIMEOUT_S = 5  # the server's wait for a scheduler's answer (a 504 past it)
# (prompt tokens, max_new_tokens, mode): mode "" = plain, "stream" = streamed to the end, "abandon" =
# streamed, then the client hangs up after 3 chunks.
SOAK = [(40 + 50 * i, (1, 9, 33, 96)[i % 4], ("", "", "stream", "abandon" if i % 8 == 3 else "stream")[i % 4])
        for i in range(32)]


@pytest.fixture(scope="module")
def server():
    d = tempfile.mkdtemp(prefix="ctxprof-fault-")
    ctxprof_fault, env = path_loaded(FAULT_PLUGIN, d)
    fault_file = os.path.join(d, "fault.json")
    with open(fault_file, "w") as f:
        json.dump({"fault": ""}, f)
    env[ctxprof_fault.ENV] = fault_file
    env[names.ENV_CONTROL_TIMEOUT_S] = str(CONTROL_TIMEOUT_S)
    srv = start_server("audit-faults", ctxprof_ref.model_args() + [names.CLI_FLAG, "--enable-metrics"], env=env)
    srv.fault_file = fault_file
    try:
        yield srv
    finally:
        srv.stop()


def set_fault(srv, name: str) -> None:
    with open(srv.fault_file, "w") as f:
        json.dump({"fault": name}, f)
    time.sleep(0.05)  # a distinct mtime


def audit(url: str) -> dict:
    st, body = http("GET", url + names.ROUTE_STATUS)
    assert st == 200, body
    (rank,) = body["ranks"]
    return rank["status"]["audit"]


def _request(url: str, n: int, new: int, mode: str, seed: int) -> int:
    body = {"input_ids": rand_ids(n, seed=seed), "rid": f"soak-{seed}-{uuid.uuid4().hex[:6]}",
            "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}
    if not mode:
        st, out = http("POST", url + "/generate", body)
        assert st == 200, out
        return 1
    _stream(url, body, lambda n: mode == "abandon" and n == 3)  # "abandon": hang up after 3 chunks
    return 1


def _stream(url: str, body: dict, stop_after: Callable[[int], bool]) -> int:
    """Stream ``body``'s request; after each chunk (counted from 1) ``stop_after(n)`` may hang up.
    Returns the chunks read."""
    host, port = url.split("//")[1].split(":")
    c = HTTPConnection(host, int(port), timeout=300)
    c.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    resp, chunks = c.getresponse(), 0
    while True:
        line = resp.fp.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data:"):
            chunks += 1
            if stop_after(chunks):
                c.sock.close()
                break
    c.close()
    return chunks


def _settled(url: str, before: int, want: int, timeout: float = 120) -> dict:
    """Wait until ``want`` more finished requests were checked (abandoned ones finish later)."""
    deadline = time.time() + timeout
    a = audit(url)
    while time.time() < deadline and a["checked"]["requests"] < before + want:
        time.sleep(0.5)
        a = audit(url)
    time.sleep(1.0)
    return audit(url)


def _metrics(url: str) -> dict[str, float]:
    st, text = http("GET", url + "/metrics")
    assert st == 200
    out: dict[str, float] = {}
    for m in re.finditer(r'^sglang_ctxprof_invariant_violations_total\{([^}]*)\} (\S+)$', text, re.M):
        inv = re.search(r'invariant="([^"]+)"', m.group(1)).group(1)
        out[inv] = out.get(inv, 0.0) + float(m.group(2))
    return out


@pytest.fixture(scope="module")
def soaked(server):
    assert http("POST", server.url + names.ROUTE_RESET)[0] == 200
    before = audit(server.url)["checked"]["requests"]
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda a: _request(server.url, a[1][0], a[1][1], a[1][2], 5000 + a[0]), enumerate(SOAK)))
    return _settled(server.url, before, len(SOAK) - 2)


def test_a_mixed_soak_leaves_every_counter_at_zero(server, soaked):
    print(f"soak audit: {soaked['checked']}")
    assert soaked["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), soaked["latest"]
    assert soaked["latest"] == []
    assert soaked["checked"]["requests"] >= len(SOAK) - 2 and soaked["checked"]["steps"] >= 30
    assert _metrics(server.url) == dict.fromkeys(names.AUDIT_INVARIANTS, 0.0)
    flags = http("GET", server.url + names.ROUTE + "/diagnosis")[1]["flags"]
    assert not [f for f in flags if f["kind"] == "invariant_violations"]


@pytest.mark.parametrize("inv", names.AUDIT_INVARIANTS)
def test_each_fault_raises_exactly_its_counter(server, soaked, inv):
    a0, m0 = audit(server.url), _metrics(server.url)
    set_fault(server, inv)
    try:
        st, out = http("POST", server.url + "/generate", {
            "input_ids": rand_ids(300, seed=77), "rid": f"fault-{inv}-{uuid.uuid4().hex[:6]}",
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
        assert st == 200, out
        a1 = _settled(server.url, a0["checked"]["requests"], 1)
    finally:
        set_fault(server, "")
    rose = {k: a1["violations"][k] - a0["violations"][k] for k in names.AUDIT_INVARIANTS}
    print(f"{inv}: {rose}")
    assert rose[inv] > 0 and all(v == 0 for k, v in rose.items() if k != inv), (rose, a1["latest"])
    assert a1["latest"][-1]["invariant"] == inv
    m1 = _metrics(server.url)
    assert {k: m1[k] - m0.get(k, 0.0) for k in m1} == {k: float(v) for k, v in rose.items()}
    text = http("GET", server.url + names.ROUTE + "?format=prometheus")[1]
    assert f'sglang_ctxprof_invariant_violations_total{{invariant="{inv}"}} {a1["violations"][inv]}' in text
    flags = http("GET", server.url + names.ROUTE + "/diagnosis")[1]["flags"]
    assert any(f["kind"] == "invariant_violations" and inv in f["message"] for f in flags)


def _metric_steps(url: str) -> float:
    text = http("GET", url + "/metrics")[1]
    return sum(float(m.group(1)) for m in re.finditer(r"^sglang_ctxprof_steps_total\{[^}]*\} (\S+)$", text, re.M))


def test_a_stalled_sink_stalls_neither_requests_nor_reads(server):
    url = server.url
    steps0, prof0 = _metric_steps(url), http("GET", url + names.ROUTE)[1]["totals"]["decode_steps"]
    set_fault(server, "stall_sink")
    try:  # the drain thread now waits inside the metrics sink at its next record
        first = generate(url, rand_ids(200, seed=91), 24)
        st, body = http("GET", url + names.ROUTE, timeout=120)  # a read on the scheduler thread
        assert st == 200, body
        grew = body["totals"]["decode_steps"] - prof0
        assert grew >= first["meta_info"]["spec_verify_ct"] > 0  # the read saw every step
        second = generate(url, rand_ids(300, seed=92), 24)  # the scheduler still steps after the read
        assert second["meta_info"]["completion_tokens"] == 24
        st, r = http("GET", f"{url}{names.ROUTE_REQUESTS}/{second['meta_info']['id']}", timeout=120)
        assert st == 200 and r["steps"] == second["meta_info"]["spec_verify_ct"], r
        assert _metric_steps(url) - steps0 < grew  # ... while the sink had not seen them: it was stalled
    finally:
        set_fault(server, "")
    want = http("GET", url + names.ROUTE)[1]["totals"]["decode_steps"] - prof0
    deadline = time.time() + 120  # liveness only
    while _metric_steps(url) - steps0 < want and time.time() < deadline:
        time.sleep(0.5)
    assert _metric_steps(url) - steps0 == want  # released: every step reached the sink exactly once
    (rank,) = http("GET", url + names.ROUTE_STATUS)[1]["ranks"]
    assert rank["status"]["sink_dropped"] == 0 and rank["status"]["degraded"] is None


def test_a_hung_scheduler_gets_reads_a_504_and_never_another_commands_answer(server):
    """A scheduler that answers no control command (the plugin's ``hang_control``: its thread waits
    inside the answer, as a hung rank's would) costs a read a 504 after the control timeout, and
    the reads after it a 504 at once, naming the command still out (nothing queues behind it); it is
    no failure of ours.  Once the scheduler answers, each read gets its own command's answer, not
    the late one."""
    url = server.url
    set_fault(server, "hang_control")
    try:
        st, body = http("GET", url + names.ROUTE_STATUS, timeout=4 * CONTROL_TIMEOUT_S)
        print("hung, first read:", st, body)
        assert st == 504 and f"within {CONTROL_TIMEOUT_S} s" in body["error"], (st, body)
        st, body = http("GET", url + names.ROUTE_REQUESTS + "?slowest=3", timeout=4 * CONTROL_TIMEOUT_S)
        print("hung, next read:", st, body)
        assert st == 504 and f"has not answered the '{names.CMD_STATUS}' command" in body["error"], (st, body)
        for method, route in [("GET", names.ROUTE), ("GET", names.ROUTE + "?format=prometheus"),
                              ("GET", names.ROUTE + "?format=text"), ("POST", names.ROUTE_RESET)]:
            st, body = http(method, url + route, timeout=4 * CONTROL_TIMEOUT_S)  # every route alike
            assert st == 504 and "has not answered" in body["error"], (route, st, body)
    finally:
        set_fault(server, "")
    deadline = time.time() + 60  # liveness only: the late answer arrives
    while True:
        st, body = http("GET", url + names.ROUTE_REQUESTS + "?slowest=3")
        if st != 504 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert st == 200 and isinstance(body.get("requests"), list), (st, body)  # its own answer
    st, body = http("GET", url + names.ROUTE_STATUS)
    assert st == 200 and body["ranks"][0]["status"]["degraded"] is None, body


def _stream_acting(url: str, rid: str, actions: dict[int, str]) -> None:
    """Stream a 160-token request; after chunk ``n`` POST the route ``actions[n]``."""
    body = {"input_ids": rand_ids(400, seed=93), "rid": rid,
            "sampling_params": {"max_new_tokens": 160, "temperature": 0, "ignore_eos": True}}

    def act(n: int) -> bool:
        if n in actions:
            assert http("POST", url + actions[n])[0] == 200
        return False

    chunks = _stream(url, body, act)
    assert chunks > max(actions), chunks


def test_a_reset_or_a_pause_mid_request_raises_no_counter(server):
    """A request running across a reset (its history gone) or across disable/enable (its steps in
    between unseen) is not held whole: the audit checks it for nothing instead of reporting the
    engine's books broken.  A request after it is checked as usual."""
    url = server.url
    m0 = _metrics(url)
    mid = [f"mid-reset-{uuid.uuid4().hex[:6]}", f"mid-pause-{uuid.uuid4().hex[:6]}"]
    _stream_acting(url, mid[0], {8: names.ROUTE_RESET})
    _stream_acting(url, mid[1], {8: names.ROUTE + "/disable", 16: names.ROUTE + "/enable"})
    for rid in mid:  # and says so: its totals are a lower bound
        status, r = http("GET", f"{url}{names.ROUTE_REQUESTS}/{rid}")
        assert status == 200 and r["partial"] is True and r["finished"], r
    off = f"mid-off-{uuid.uuid4().hex[:6]}"  # finishes while profiling is off: it ends when it is on again
    _stream_acting(url, off, {8: names.ROUTE + "/disable"})
    assert http("POST", url + names.ROUTE + "/enable")[0] == 200
    status, r = http("GET", f"{url}{names.ROUTE_REQUESTS}/{off}")
    assert status == 200 and r["partial"] is True and r["finished"] is True, r
    before = audit(url)["checked"]["requests"]
    generate(url, rand_ids(120, seed=94), 12)  # finishes after both: its check comes after theirs
    a = _settled(url, before, 1)
    assert a["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), a["latest"]
    assert a["checked"]["requests"] >= before + 1
    assert {k: v - m0.get(k, 0.0) for k, v in _metrics(url).items()} == dict.fromkeys(names.AUDIT_INVARIANTS, 0.0)
