"""Deep capture through SGLang's own profiler, on a real CPU server (``collect.capture``).

One server (tiny DeepSeek-V3, identity EAGLE head) with the slow-step trigger on (8x the step's
context model), an admin key, a short cooling-off interval, and the test-only ``ctxprof_plant``
plugin, whose ``slow_steps`` plant makes the next verify forwards sleep inside a named profiler
range.  In order:

1. a planted slow step triggers exactly one capture, starting within 2 steps of the slow one; its
   file exists, is under the byte cap and is a valid trace; inside it the ops sit under our
   ``ctxprof.<phase>`` ranges and the planted work sits under ``verify_attn``;
2. a second planted slow step inside the cooling-off window is suppressed and counted, and so is an
   admin ``POST /ctx_profile/capture``;
3. without the admin key ``POST /ctx_profile/capture`` (and ``/cancel``) is refused (401) and starts nothing;
4. ``?rid=`` captures that request's steps, and the request links to the capture;
5. the merged timeline loads as JSON and our step slices overlap the trace's step ranges;
6. the CLIs show and take captures;
7. the slow-request trigger (on, but the trace policy starts with both criteria at 0: nothing is
   slow until the test sets ``slow_step_ms`` and ``mode=slow`` at run time) captures the next steps
   of a request made slow by a planted slow step; the request's OTel span (to an in-process OTLP
   receiver) names that capture, and the diagnosis flags it;
8. a rid capture whose request never comes fails at its ``wait_s`` and gives back its cooling-off;
   an admin cancels a pending capture (the CLI) and a running one (its steps so far are kept).
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import Counter

import pytest

import ctxprof_ref
from conftest import generate, http, rand_ids
from plant_rig import plant, start_planted
from test_tracing import Receiver
from sglang_ctxprof.model import names
from sglang_ctxprof.views.timeline import OUR_PID

pytestmark = pytest.mark.server

ADMIN = "capture-admin-key"
INTERVAL_S = 40  # the cooling-off window: longer than the first capture's slow steps and export
MAX_MB = 64
R = names.ROUTE_CAPTURE
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
DONE = (names.CAPTURE_DONE, names.CAPTURE_FAILED, names.CAPTURE_DELETED)
STATE: dict = {}
RECEIVER: list = []


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("capture")
    env = {names.ENV_CAPTURE_DIR: str(d / "captures"), names.ENV_CAPTURE_INTERVAL_S: str(INTERVAL_S),
           names.ENV_CAPTURE_SLOW_FACTOR: str(SLOW_FACTOR), names.ENV_CAPTURE_STEPS: "4", names.ENV_CAPTURE_MAX_MB: str(MAX_MB),
           names.ENV_CAPTURE_SLOW_REQUEST: "1", names.ENV_TRACE_SLOW_TOK_S: "0", names.ENV_TRACE_SLOW_STEP_MS: "0"}
    RECEIVER.append(Receiver())
    env.update({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": RECEIVER[0].endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"})
    args = ctxprof_ref.model_args() + [names.CLI_FLAG, "--admin-api-key", ADMIN]
    srv = start_planted("capture", args, d, env=env)
    try:
        generate(srv.url, rand_ids(300, seed=1), max_new_tokens=80)  # warm-up; the bucket's steps
        yield srv
    finally:
        srv.stop()
        RECEIVER.pop().stop()


def capture_status(server) -> dict:
    status, body = http("GET", server.url + names.ROUTE_STATUS)
    assert status == 200, body
    return body["ranks"][0]["status"]["capture"]


def background(server, n: int, new: int, seed: int, rid: str | None = None) -> threading.Thread:
    body = {"input_ids": rand_ids(n, seed=seed), "sampling_params": {"max_new_tokens": new, "temperature": 0,
                                                                     "ignore_eos": True}}
    if rid:
        body["rid"] = rid
    t = threading.Thread(target=http, args=("POST", server.url + "/generate", body), daemon=True)
    t.start()
    return t


def wait_done(server, cid: str, timeout: float = 240) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        for c in capture_status(server)["captures"]:
            if c["id"] == cid and c["state"] in DONE:
                return c
        time.sleep(0.5)
    raise AssertionError(f"capture {cid} did not finish: {capture_status(server)}")


# A natural stall on a loaded 2-core machine reaches ~7x a warm step (440 ms seen against ~60), and a
# loaded step runs ~150 ms: the trigger's factor sits above the stall, the planted step far above both.
SLOW_FACTOR = 8
PLANTED_MS = 2000

def plant_slow(server, ms: int, n: int) -> None:
    plant(server, slow_steps=[ms, n])


def load_trace(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def inside(e: dict, r: dict) -> bool:
    return r["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= r["ts"] + r["dur"] + 1e-3


def test_a_planted_slow_step_triggers_exactly_one_capture(server, capsys):
    before = capture_status(server)
    assert before["fired"] == {}, before["captures"]
    assert before["triggers"]["slow_step"]["on"] is True
    plant_slow(server, PLANTED_MS, 6)
    gen = background(server, 300, 60, seed=11)
    t0 = time.time()
    while not capture_status(server)["captures"] and time.time() - t0 < 120:
        time.sleep(0.2)
    cap = capture_status(server)["captures"]
    assert len(cap) == 1, cap
    info = wait_done(server, cap[0]["id"])
    gen.join(300)
    assert info["state"] == names.CAPTURE_DONE, info
    assert info["trigger"] == names.TRIGGER_SLOW_STEP and info["trigger_step"] is not None
    assert len(info["step_ids"]) == 4 and info["step_ids"] == list(range(info["step_ids"][0], info["step_ids"][0] + 4))
    assert 1 <= info["step_ids"][0] - info["trigger_step"] <= 2, info
    st = capture_status(server)
    assert st["fired"] == {names.TRIGGER_SLOW_STEP: 1}
    import os

    assert os.path.isfile(info["path"]) and info["path"].startswith(str(server.dir / "captures"))
    assert 0 < info["bytes"] == os.path.getsize(info["path"]) <= MAX_MB * 1024 * 1024
    assert st["bytes_kept"] == info["bytes"]
    trace = load_trace(info["path"])
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in ev if e["name"].startswith(names.RANGE_PREFIX)]
    steps = [e for e in ranges if e["name"].startswith(names.RANGE_STEP + " ")]
    assert [int(e["name"].split("step=")[1].split()[0]) for e in steps] == info["step_ids"]
    phases = [e for e in ranges if e not in steps and e["name"] != names.RANGE_CLOCK_SYNC]
    assert {e["name"].split()[0] for e in phases} >= {"ctxprof.draft", "ctxprof.verify", "ctxprof.verify_attn",
                                                      "ctxprof.draft_extend"}
    for e in phases:  # every phase range sits inside its own step's range
        sid = e["name"].split("step=")[1].split()[0]
        assert any(inside(e, s) and f"step={sid} " in s["name"] for s in steps), e["name"]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and any(inside(e, s) for s in steps)]
    under = [e for e in ops if any(inside(e, r) for r in phases)]
    # Ops of a step outside every phase are the worker's own bookkeeping between phases, which
    # ctxprof charges to "overhead"; the model's work runs inside the phases.
    rest = Counter(e["name"] for e in ops if not any(inside(e, r) for r in phases))
    assert ops and len(under) >= 0.9 * len(ops), (len(under), len(ops), rest.most_common(10))
    planted = [e for e in ev if e["name"] == "ctxprof_plant.slow_step" and any(inside(e, s) for s in steps)]
    assert planted, "the planted work ran inside the captured steps"
    for e in planted:
        attn = [r for r in phases if inside(e, r) and r["name"].startswith("ctxprof.verify_attn ")]
        assert attn, "planted work outside verify_attn"
    STATE["first"] = info
    with capsys.disabled():
        print(f"\ncapture {info['id']}: steps {info['step_ids']} (trigger step {info['trigger_step']}), "
              f"{info['bytes']} bytes, stop {info['stop_ms']:.1f} ms on the scheduler thread (torch's stop() "
              f"{info['profiler_stop_ms']:.1f} ms), export "
              f"{info['export_ms']:.0f} ms off it, longest step-start interval while exporting "
              f"{info['export_gap_ms']:.1f} ms over {info['export_steps']} steps; {len(under)} of {len(ops)} ops in "
              f"the steps under a phase range; the others: {rest.most_common(6)}")


def test_a_second_trigger_in_the_cooling_off_window_is_suppressed(server):
    if "first" not in STATE:
        pytest.skip("needs the first capture")
    # The manual ask comes first, right after the first capture finished: the window is counted
    # from that capture's request, and its slow steps and export already took part of it.
    since = time.time() - STATE["first"]["requested_ns"] / 1e9
    status, body = http("POST", server.url + R + "?steps=2", headers=ADMIN_H)
    assert status == 429 and "cooling off" in body["error"] and body["retry_after_s"] > 0, (since, body)
    plant_slow(server, PLANTED_MS, 1)  # one slow step: the trigger fires inside the window
    gen = background(server, 300, 12, seed=12)
    gen.join(300)
    st = capture_status(server)
    assert st["fired"] == {names.TRIGGER_SLOW_STEP: 1}
    assert st["suppressed"][names.TRIGGER_SLOW_STEP] >= 1 and st["suppressed"][names.TRIGGER_MANUAL] == 1, st
    assert len(st["captures"]) == 1


@pytest.mark.parametrize("key", [None, "wrong"])
def test_capture_without_the_admin_key_is_refused(server, key):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    before = capture_status(server)
    status, body = http("POST", server.url + R + "?steps=2", headers=h)
    assert status == 401, body
    assert http("POST", server.url + names.ROUTE_CAPTURE_CANCEL, headers=h)[0] == 401
    after = capture_status(server)
    # what a refused ask would have moved; the slow-step trigger may still count the last test's
    # steps the drain thread feeds its sinks meanwhile (suppressed in the cooling-off window)
    asked = (names.TRIGGER_MANUAL, names.TRIGGER_RID)
    assert [c["id"] for c in after["captures"]] == [c["id"] for c in before["captures"]]
    assert [after["suppressed"].get(t) for t in asked] == [before["suppressed"].get(t) for t in asked]
    assert [after["fired"].get(t) for t in asked] == [before["fired"].get(t) for t in asked]


def test_bad_capture_requests_are_400(server):
    for q in ("?steps=0", "?steps=33", "?steps=x", "?rid=bad%01rid", "?color=red"):
        status, body = http("POST", server.url + R + q, headers=ADMIN_H)
        assert status == 400 and "error" in body, (q, body)


def test_capture_by_rid_covers_that_request_and_links_back(server):
    plant(server)
    rid = "capture-rid-1"
    t0 = time.time()
    while True:  # wait out the cooling-off window of the first capture
        status, body = http("POST", server.url + R + f"?rid={rid}&steps=16", headers=ADMIN_H)
        if status != 429 or time.time() - t0 > INTERVAL_S + 30:
            break
        time.sleep(min(2.0, max(0.2, float(body.get("retry_after_s") or 1))))
    assert status == 200 and body["accepted"], body
    cid = body["captures"][0]["id"]
    assert body["captures"][0]["trigger"] == names.TRIGGER_RID
    gen = background(server, 120, 120, seed=22, rid=rid)
    time.sleep(0.2)  # its first steps have run: SGLang runs the next request's prefill between two of them
    background(server, 150, 12, seed=21)  # not the one asked for: passed over, the capture goes on
    gen.join(300)
    info = wait_done(server, cid)
    assert info["state"] == names.CAPTURE_DONE and len(info["step_ids"]) == 16, info
    status, full = http("GET", server.url + f"{R}/{cid}")
    assert status == 200, full
    recs = full["ranks"][0]["steps"]
    assert sorted(r["step_id"] for r in recs) == info["step_ids"]
    assert all(rid in r["rids"] for r in recs)
    status, req = http("GET", server.url + f"{names.ROUTE_REQUESTS}/{rid}")
    assert status == 200 and [c["id"] for c in req["captures"]] == [cid], req
    STATE["rid"] = info


def test_the_merged_timeline_puts_our_steps_on_the_trace_clock(server, capsys):
    info = STATE.get("rid") or STATE.get("first")
    if info is None:
        pytest.skip("needs a capture")
    status, tl = http("GET", server.url + f"{R}/{info['id']}?format=timeline")
    assert status == 200, tl
    json.dumps(tl)
    clock = tl["otherData"]["clock"]
    assert clock["aligned_on"] == names.RANGE_CLOCK_SYNC and clock["error_bound_ns"] >= 0
    ev = [e for e in tl["traceEvents"] if e.get("ph") == "X"]
    ours = {e["args"]["step_id"]: e for e in ev if e["name"] in ("decode step", "prefill")
            and e.get("pid") == OUR_PID}
    theirs = {int(e["name"].split("step=")[1].split()[0]): e for e in ev
              if e["name"].startswith(names.RANGE_STEP + " ")}
    assert sorted(ours) == sorted(theirs) == info["step_ids"]
    for sid, e in ours.items():  # the step slice overlaps the profiler's range of the same step
        t = theirs[sid]
        assert e["ts"] < t["ts"] + t["dur"] and t["ts"] < e["ts"] + e["dur"], (sid, e, t)
    ops = [e for e in ev if e.get("cat") == "cpu_op" and any(inside(e, t) for t in theirs.values())]
    assert ops
    status, raw = http("GET", server.url + f"{R}/{info['id']}?format=trace")
    assert status == 200
    out = server.dir / "merged_timeline.json"
    out.write_text(json.dumps(tl))
    with capsys.disabled():
        print(f"\nmerged timeline {out}: {len(ev)} slices, clock offset {clock['offset_ns'] / 1e3:.1f} us "
              f"+- {clock['error_bound_ns'] / 1e3:.1f} us")


def test_the_trace_cli_shows_the_capture_and_the_capture_cli_takes_one(server, capsys, tmp_path):
    from sglang_ctxprof.cli.main import main

    if "rid" in STATE:
        assert main(["trace", "--url", server.url, "capture-rid-1"]) == 0
        assert f"deep capture {STATE['rid']['id']} (rid, done)" in capsys.readouterr().out
    t0 = time.time()
    while capture_status(server)["captures"] and time.time() - t0 < INTERVAL_S + 5:
        last = capture_status(server)["captures"][-1]
        if time.time() - last["requested_ns"] / 1e9 > INTERVAL_S + 0.5:
            break
        time.sleep(1)
    gen = background(server, 300, 60, seed=31)
    code = main(["capture", "--url", server.url, "--steps", "2", "--admin-key", ADMIN, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    gen.join(300)
    assert code == 0, out
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0].endswith(".timeline.json") and files[1].endswith(".trace.json.gz"), files
    assert "manual capture" in out and "merged timeline" in out
    json.loads((tmp_path / files[0]).read_text())
    assert main(["capture", "--url", server.url, "--steps", "2"]) != 0  # no admin key: one line, no traceback
    assert "401" in capsys.readouterr().err


def test_a_slow_request_by_the_trace_policy_captures_its_next_steps(server, capsys):
    plant(server)
    st = capture_status(server)
    assert st["triggers"][names.TRIGGER_SLOW_REQUEST]["on"] is True
    assert names.TRIGGER_SLOW_REQUEST not in st["fired"]  # nothing was slow by the policy so far
    t0 = time.time()
    while time.time() - t0 < INTERVAL_S + 60:  # wait out the cooling-off window of the last capture
        caps = capture_status(server)["captures"]
        if all(c["state"] in DONE for c in caps) and (
                not caps or time.time() - caps[-1]["requested_ns"] / 1e9 > INTERVAL_S + 0.5):
            break
        time.sleep(1)
    n_before = len(capture_status(server)["captures"])
    status, body = http("POST", server.url + names.ROUTE_TRACE_POLICY, body={"mode": "slow", "slow_step_ms": 1000},
                        headers=ADMIN_H)
    assert status == 200, body
    try:
        rid = "slow-request-1"
        plant_slow(server, 1500, 1)  # the request's first verify step: > slow_step_ms, so the request is slow
        gen = background(server, 200, 60, seed=41, rid=rid)
        t0 = time.time()
        while len(capture_status(server)["captures"]) == n_before and time.time() - t0 < 120:
            time.sleep(0.2)
        caps = capture_status(server)["captures"][n_before:]
        assert len(caps) == 1, caps
        info = wait_done(server, caps[0]["id"])
        gen.join(300)
    finally:
        http("POST", server.url + names.ROUTE_TRACE_POLICY, body={"mode": "off", "slow_step_ms": 0}, headers=ADMIN_H)
    assert info["trigger"] == names.TRIGGER_SLOW_REQUEST and info["rid"] == rid, info
    assert info["state"] == names.CAPTURE_DONE and 1 <= len(info["step_ids"]) <= 4, info
    assert info["trigger_step"] < info["step_ids"][0] and "step " in info["reason"], info
    st = capture_status(server)
    assert st["fired"][names.TRIGGER_SLOW_REQUEST] == 1, st
    status, full = http("GET", server.url + f"{R}/{info['id']}")
    assert status == 200, full
    recs = full["ranks"][0]["steps"]
    assert sorted(r["step_id"] for r in recs) == info["step_ids"] and all(rid in r["rids"] for r in recs), recs
    status, req = http("GET", server.url + f"{names.ROUTE_REQUESTS}/{rid}")
    assert status == 200 and info["id"] in [c["id"] for c in req["captures"]], req
    # the request span names the capture that covered its steps
    t0 = time.time()
    spans = []
    while time.time() - t0 < 60 and not spans:
        spans = [s for s in RECEIVER[0].ours() if s["attrs"].get(names.ATTR_RID) == rid]
        time.sleep(0.3)
    assert len(spans) == 1, RECEIVER[0].ours()
    a = spans[0]["attrs"]
    ids = _attr_list(a, names.ATTR_CAPTURE_ID)
    assert info["id"] in ids, a
    k = ids.index(info["id"])
    assert _attr_list(a, names.ATTR_CAPTURE_URI)[k] == f"{R}/{info['id']}"
    assert _attr_list(a, names.ATTR_CAPTURE_TRIGGER)[k] == names.TRIGGER_SLOW_REQUEST
    assert _attr_list(a, names.ATTR_CAPTURE_PATH)[k] in ("", info["path"])
    assert set(info["step_ids"]) <= set(_attr_list(a, names.ATTR_CAPTURE_STEPS))
    # and the diagnosis lists it, with where to fetch it
    status, d = http("GET", server.url + names.ROUTE_DIAGNOSIS)
    assert status == 200, d
    (flag,) = [f for f in d["flags"] if f["kind"] == "captures"]
    assert f"{info['id']} (slow_request for request {rid}" in flag["message"]
    assert f"GET {R}/{info['id']}?format=timeline" in flag["message"]
    with capsys.disabled():
        print(f"\nslow-request capture {info['id']}: trigger step {info['trigger_step']}, steps {info['step_ids']}, "
              f"{info['bytes']} bytes, stop {info['stop_ms']:.1f} ms, export {info['export_ms']:.0f} ms; reason: "
              f"{info['reason']}; span attrs: {sorted(k for k in a if 'capture' in k)}; flag: {flag['message']}")


def test_a_capture_that_cannot_start_fails_at_its_wait_and_cancel_ends_one_pending_or_running(server, capsys):
    """A rid that never comes no longer holds the one capture: the first control request after its
    ``wait_s`` fails it, and its cooling-off is given back; an admin cancels a pending capture (an
    idle server) from the CLI, and a running one stops with the steps it has, its trace written."""
    from sglang_ctxprof.cli.main import main

    plant(server)
    t0 = time.time()
    while True:  # wait out the cooling-off window of the last capture
        status, body = http("POST", server.url + R + "?rid=never-sent-1&wait_s=2", headers=ADMIN_H)
        if status != 429 or time.time() - t0 > INTERVAL_S + 30:
            break
        time.sleep(min(2.0, max(0.2, float(body.get("retry_after_s") or 1))))
    assert status == 200 and body["captures"][0]["wait_s"] == 2, body
    gone = body["captures"][0]["id"]
    status, body = http("POST", server.url + R + "?steps=2", headers=ADMIN_H)
    assert status == 429 and f"{gone} is pending" in body["error"], body
    time.sleep(2.5)
    (info,) = [c for c in capture_status(server)["captures"] if c["id"] == gone]  # this read failed it
    assert info["state"] == names.CAPTURE_FAILED and info["error"] == "not started in 2 s: request never-sent-1 not seen"
    status, body = http("POST", server.url + R + "?steps=2", headers=ADMIN_H)  # not cooled off
    assert status == 200, body
    idle = body["captures"][0]["id"]
    assert main(["capture", "--url", server.url, "--admin-key", ADMIN, "--cancel", idle]) == 0
    assert f"capture {idle} cancelled: {names.CAPTURE_FAILED}, steps []" in capsys.readouterr().out
    status, body = http("POST", server.url + names.ROUTE_CAPTURE_CANCEL, headers=ADMIN_H)
    assert status == 404 and body["error"] == "no capture is pending or running", body
    status, body = http("POST", server.url + R + "?steps=32", headers=ADMIN_H)
    assert status == 200, body
    cid = body["captures"][0]["id"]
    plant_slow(server, 200, 40)  # 32 steps would take 6 s and more
    gen = background(server, 100, 60, seed=51)
    t0 = time.time()
    while time.time() - t0 < 120:
        (info,) = [c for c in capture_status(server)["captures"] if c["id"] == cid]
        if len(info["step_ids"]) >= 2:
            break
        time.sleep(0.2)
    status, body = http("POST", server.url + names.ROUTE_CAPTURE_CANCEL + f"?id={cid}", headers=ADMIN_H)
    assert status == 200 and body["cancelled"][0]["cancelled"] is True, body
    plant(server)
    info = wait_done(server, cid)
    gen.join(300)
    assert info["state"] == names.CAPTURE_DONE and 2 <= len(info["step_ids"]) < 32, info
    trace = load_trace(info["path"])
    assert any(e.get("name", "").startswith("ctxprof.") for e in trace["traceEvents"])
    status, full = http("GET", server.url + f"{R}/{cid}")
    assert status == 200 and sorted(r["step_id"] for r in full["ranks"][0]["steps"]) == info["step_ids"], full
    st = capture_status(server)
    assert [c["state"] for c in st["captures"] if c["id"] in (gone, idle)] == [names.CAPTURE_FAILED] * 2
    with capsys.disabled():
        print(f"\ncancelled running capture {cid}: {len(info['step_ids'])} of 32 steps, {info['bytes']} bytes")


def _attr_list(attrs: dict, key: str) -> list:
    """A list attribute as the test receiver decodes it (an OTLP ArrayValue)."""
    v = attrs.get(key)
    return [getattr(x, x.WhichOneof("value")) for x in v.values] if v is not None else []
