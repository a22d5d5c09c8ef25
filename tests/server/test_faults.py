"""Exact accounting under faults, on a real CPU server (tiny DeepSeek-V3 + EAGLE) under SGLang's own
retraction test switch.

``SGLANG_TEST_RETRACT=1`` makes SGLang retract one running request every 3 forward steps (the path it
takes when the KV cache runs out): the request goes back to the queue and is prefilled again with
its prompt plus what it generated so far, and that prefill appends one token.  Every finished
request must still reconcile with its ``meta_info``: prompt tokens as SGLang reports them, decode
steps == ``spec_verify_ct`` (speculative) or one per plain decode step, ``1 + committed ==
completion_tokens``, and our retraction count == ``num_retractions``; the profile counts the
retractions per prefill bucket.  A reset while requests wait retracted leaves their entries with
SGLang's prompt tokens, and the self-audit quiet.  A rid used again after its request ended is a
new request, and a client that hangs up mid-stream leaves a finished request with its steps.

``SGLANG_TEST_RETRACT_NO_PREFILL_BS=0`` (SGLang's companion switch) admits new prefills only while
nothing is running, so a retracted request waits in the queue until the others finish: there it can
be aborted (``POST /abort_request``), and so can a request queued behind running ones whose client
hangs up before its first step.  Each must end: no aborted request stays unfinished in
``/ctx_profile/requests``; a retracted one says ``aborted: "retracted"``, and ``totals.requests_aborted``
counts every request aborted while it waited, also the one that never ran a step.  Every exporter
says the same (the server runs with ``--enable-metrics``, every request traced to an OTLP receiver in
the test, JSON log events to a file): ``sglang_ctxprof_requests_aborted_total{kind}``, one
``request_aborted`` event and one root span with ``ctxprof.aborted`` per aborted request.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
import uuid

import pytest

import ctxprof_ref
from conftest import LOG_DIR, http, rand_ids, start_server
from otlp_receiver import Receiver
from sglang_ctxprof.model import names
from http.client import HTTPConnection

pytestmark = pytest.mark.server

MIX = [(96 + 97 * i, 24 + (i * 7) % 20) for i in range(8)]  # (prompt, max_new_tokens), 8 at once


EVENTS = LOG_DIR / "faults-events.jsonl"
RECEIVER: Receiver = None  # type: ignore[assignment]  # set by the module fixture


@pytest.fixture(scope="module")
def server():
    global RECEIVER
    RECEIVER = Receiver()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    EVENTS.unlink(missing_ok=True)
    # every exporter on, every request traced: the aborted ones must reach each of them
    srv = start_server("faults-retract", ctxprof_ref.model_args() + [names.CLI_FLAG, "--enable-metrics"],
                       env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_NO_PREFILL_BS": "0",
                            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": RECEIVER.endpoint,
                            "OTEL_BSP_SCHEDULE_DELAY": "200", "SGLANG_CTXPROF_TRACE": "all",
                            "SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": str(EVENTS),
                            "SGLANG_CTXPROF_LOG_SUMMARY_S": "0"})
    try:
        yield srv
    finally:
        srv.stop()
        RECEIVER.stop()


def gen(url: str, ids: list[int], n: int, rid: str | None = None) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    if rid:
        body["rid"] = rid
    status, out = http("POST", url + "/generate", body)
    assert status == 200, out
    return out


@pytest.fixture(scope="module")
def retracted(server):
    assert http("POST", server.url + names.ROUTE_RESET)[0] == 200
    with cf.ThreadPoolExecutor(len(MIX)) as ex:
        outs = list(ex.map(lambda m: gen(server.url, rand_ids(m[0], seed=900 + m[0]), m[1]), MIX))
    time.sleep(1.0)  # the drain thread records the last steps
    reqs = {}
    for o in outs:
        st, r = http("GET", f"{server.url}{names.ROUTE_REQUESTS}/{o['meta_info']['id']}")
        assert st == 200, r
        reqs[o["meta_info"]["id"]] = r
    body = http("GET", server.url + names.ROUTE)[1]
    return outs, reqs, body


def test_retraction_really_happened(retracted):
    outs, _, _ = retracted
    n = sum(o["meta_info"].get("num_retractions", 0) for o in outs)
    print(f"num_retractions over {len(outs)} requests: {n}")
    assert n > 0


def test_every_retracted_request_reconciles(server, retracted):
    outs, reqs, body = retracted
    reconciled = 0
    for o in outs:
        mi = o["meta_info"]
        r = reqs[mi["id"]]
        nr = mi.get("num_retractions", 0)
        assert r["finished"] is True
        assert r["prompt_tokens"] == mi["prompt_tokens"], (mi, r)
        assert 1 + r["committed"] == mi["completion_tokens"], (mi, r)
        assert r["steps"] == mi.get("spec_verify_ct", 0), (mi, r)
        rows = r["step_rows"]
        assert len(rows) == r["steps"] and sum(x["committed"] for x in rows) == r["committed"] - nr
        reconciled += 1
    for o in outs:  # then the retractions themselves, per request
        assert reqs[o["meta_info"]["id"]].get("retractions") == o["meta_info"].get("num_retractions", 0)
    print(f"reconciled {reconciled} of {len(outs)}")
    total = sum(o["meta_info"].get("num_retractions", 0) for o in outs)
    assert body["totals"].get("retractions") == total
    assert sum(p.get("retractions", 0) for p in body["prefill"]) == total
    assert body["totals"]["committed"] == sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    assert body["dropped"] == 0


def test_a_reused_rid_is_kept_apart(server):
    rid = f"reused-{uuid.uuid4().hex[:8]}"
    first = gen(server.url, rand_ids(120, seed=41), 6, rid=rid)["meta_info"]
    second = gen(server.url, rand_ids(300, seed=42), 11, rid=rid)["meta_info"]
    time.sleep(0.5)
    st, r = http("GET", f"{server.url}{names.ROUTE_REQUESTS}/{rid}")
    assert st == 200 and r.get("use") == 1, r
    assert r["prompt_tokens"] == second["prompt_tokens"] and 1 + r["committed"] == second["completion_tokens"], r
    rows = http("GET", f"{server.url}{names.ROUTE_REQUESTS}?slowest=1000")[1]["requests"]
    mine = sorted((x for x in rows if x["rid"] == rid), key=lambda x: x.get("use", 0))
    assert [(x.get("use"), x["prompt_tokens"], 1 + x["committed"]) for x in mine] == [
        (0, first["prompt_tokens"], first["completion_tokens"]), (1, second["prompt_tokens"], second["completion_tokens"])]


def test_each_use_of_a_rid_is_exported_once_with_its_own_numbers(server):
    # Back to back: the next use is prefilled within a few ms of the last one's finish, often before
    # the exporters have seen that finish (the drain feeds the aggregator a whole queue first).
    rid = f"reexport-{uuid.uuid4().hex[:8]}"
    uses = [gen(server.url, rand_ids(100 + 37 * k, seed=70 + k), 4 + (k % 3), rid=rid)["meta_info"]
            for k in range(8)]
    want = sorted((m["prompt_tokens"], m["completion_tokens"] - 1) for m in uses)
    def roots() -> list[dict]:
        return [sp["attrs"] for sp in RECEIVER.ours() if sp["attrs"][names.ATTR_RID] == rid]

    deadline = time.time() + 20
    while len(roots()) < len(uses) and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(1.0)  # a late extra span would show here
    roots = roots()
    got = sorted((a[names.ATTR_PROMPT_TOKENS], a[names.ATTR_COMMITTED]) for a in roots)
    print("uses (prompt, committed):", want, "exported:", got)
    assert got == want
    assert all(a[names.ATTR_FINISHED] for a in roots)


def test_a_client_hanging_up_mid_stream_leaves_a_finished_request(server):
    rid = f"hangup-{uuid.uuid4().hex[:8]}"
    host, port = server.url.split("//")[1].split(":")
    c = HTTPConnection(host, int(port), timeout=120)
    c.request("POST", "/generate", json.dumps({
        "input_ids": rand_ids(200, seed=43), "rid": rid, "stream": True,
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}),
        {"Content-Type": "application/json"})
    resp = c.getresponse()
    chunks = 0
    while chunks < 5:
        if resp.fp.readline().startswith(b"data:"):
            chunks += 1
    c.sock.close()  # hang up
    c.close()
    deadline = time.time() + 60
    r = None
    while time.time() < deadline:
        st, r = http("GET", f"{server.url}{names.ROUTE_REQUESTS}/{rid}")
        if st == 200 and r["finished"]:
            break
        time.sleep(0.5)
    assert r is not None and r["finished"] is True and r["steps"] >= 3, r
    assert 1 + r["committed"] < 400  # it stopped early


def _until_one_runs_alone(url: str, ex: cf.Executor, rids: list[str], seed: int, max_new: int):
    """Three prompts sent as one batch (prefilled together), then polled until one has run 12 steps
    on alone (a retraction every 3 steps: the other two were retracted and wait): the batch's future
    and the entries last seen."""
    body = {"input_ids": [rand_ids(150 + 40 * k, seed=seed + k) for k in range(3)], "rid": rids,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    batch = ex.submit(http, "POST", url + "/generate", body)
    deadline, seen = time.time() + 120, {}
    while time.time() < deadline:
        seen = {rid: _req(url, rid) for rid in rids}
        if max((r["steps"] for r in seen.values() if r), default=0) >= 12:
            break
        time.sleep(0.3)
    return batch, seen


def _req(url: str, rid: str):
    st, r = http("GET", f"{url}{names.ROUTE_REQUESTS}/{rid}")
    return r if st == 200 else None


def test_requests_aborted_while_waiting_end_and_are_counted(server):
    url = server.url
    assert http("POST", url + names.ROUTE_RESET)[0] == 200
    before = _aborted_counter(url)
    tag = uuid.uuid4().hex[:8]
    rids = [f"wait-{tag}-{k}" for k in "abc"]
    with cf.ThreadPoolExecutor(2) as ex:
        # long enough that the one left running outlives the aborts below (300 tokens ended in ~3 s)
        batch, seen = _until_one_runs_alone(url, ex, rids, 60, 2500)
        assert all(seen.values()), seen  # all three were prefilled (one batch)
        # a request queued behind the running one, whose client hangs up before its first step
        queued = f"queued-{tag}"
        host, port = url.split("//")[1].split(":")
        c = HTTPConnection(host, int(port), timeout=60)
        c.request("POST", "/generate", json.dumps({
            "input_ids": rand_ids(90, seed=64), "rid": queued,
            "sampling_params": {"max_new_tokens": 50, "temperature": 0, "ignore_eos": True}}),
            {"Content-Type": "application/json"})
        time.sleep(1.0)
        assert _req(url, queued) is None  # still waiting: no step yet
        c.sock.close()  # hang up while queued: SGLang's tokenizer aborts it within ~4 s
        c.close()
        deadline = time.time() + 60
        while time.time() < deadline and http("GET", url + names.ROUTE)[1]["totals"].get("requests_aborted", 0) < 1:
            time.sleep(0.5)
        for rid in rids:  # the retracted ones are popped from the queue, the running one finishes
            assert http("POST", url + "/abort_request", {"rid": rid})[0] == 200
        batch.result()
    time.sleep(1.0)
    reqs = {rid: _req(url, rid) for rid in rids}
    print("after abort:", {rid: (r["steps"], r["retractions"], r["finished"], r.get("aborted"))
                           for rid, r in reqs.items()})
    assert all(r["finished"] is True for r in reqs.values()), reqs
    retracted = [rid for rid, r in reqs.items() if r["aborted"] == "retracted"]
    assert len(retracted) >= 1, reqs  # 3 decoding at once, a retraction every 3 steps: 2 wait
    assert all(reqs[rid]["retractions"] >= 1 for rid in retracted), reqs  # SGLang's count, at the end
    assert _req(url, queued) is None
    totals = http("GET", url + names.ROUTE)[1]["totals"]
    print("requests_aborted:", totals["requests_aborted"], "retracted then aborted:", len(retracted))
    assert totals["requests_aborted"] == 1 + sum(1 for r in reqs.values() if r["aborted"]), (totals, reqs)
    # a retraction aborted before its re-prefill is in no bucket, yet in the total (KV pressure seen)
    assert totals["retractions"] == sum(r["retractions"] for r in reqs.values()), (totals, reqs)
    rows = http("GET", f"{url}{names.ROUTE_REQUESTS}?slowest=1000")[1]["requests"]
    assert [x["rid"] for x in rows if not x["finished"]] == []
    # every exporter says the same: the /metrics counter (by kind, since this test's start), one
    # request_aborted event and one root span named by its kind per aborted request
    want = {rid: r["aborted"] for rid, r in reqs.items() if r["aborted"]}
    want[queued] = names.ABORT_QUEUED
    kinds = {k: sum(1 for v in want.values() if v == k) for k in names.ABORT_KINDS}
    assert totals["requests_aborted"] == len(want) and totals["requests_aborted_retracted"] == kinds["retracted"]
    after = _aborted_counter(url)
    print("requests_aborted_total by kind:", {k: after[k] - before[k] for k in after})
    assert {k: after[k] - before[k] for k in names.ABORT_KINDS} == kinds
    ev = _wait(lambda: (lambda e: e if set(e) >= set(want) else None)(_abort_events()), "request_aborted events")
    print("request_aborted events:", {r: ev[r] for r in want})
    assert {r: ev[r]["aborted"] for r in want} == want
    assert all(ev[r]["steps"] == reqs[r]["steps"] for r in want if r in reqs)
    roots = _wait(lambda: (lambda s: s if set(s) >= set(want) else None)(
        {sp["attrs"][names.ATTR_RID]: sp for sp in RECEIVER.ours() if sp["attrs"][names.ATTR_RID] in want}),
        "the aborted requests' root spans")
    print("root spans:", {r: (s["attrs"].get(names.ATTR_ABORTED), s["attrs"][names.ATTR_STEPS]) for r, s in roots.items()})
    assert {r: s["attrs"].get(names.ATTR_ABORTED) for r, s in roots.items()} == want
    for rid, sp in roots.items():
        mine = [x for x in RECEIVER.spans if x["trace_id"] == sp["trace_id"] and x["scope"] == names.TRACER_NAME]
        steps = [x for x in mine if x["name"] == names.SPAN_STEP]
        assert len(steps) == sp["attrs"][names.ATTR_STEPS] == (reqs[rid]["steps"] if rid in reqs else 0)
        assert all(x["parent"] == sp["span_id"] for x in steps) and sp["end"] >= max((x["end"] for x in mine))
    assert [x for x in RECEIVER.spans if x["trace_id"] == roots[queued]["trace_id"]] == [roots[queued]]


def test_a_reset_while_requests_wait_retracted_keeps_their_prompt_and_books(server):
    """The history cleared while requests wait retracted: their re-prefill (prompt + output) is the
    first the history sees of them.  Each has SGLang's prompt tokens, and the self-audit checks
    none of them (its first prefill and steps went unseen): no violation.  (A re-prefill in chunks,
    whose first chunk appends no token, is the unit tests' ``test_requests``.)"""
    url = server.url
    assert http("POST", url + names.ROUTE_RESET)[0] == 200
    tag = uuid.uuid4().hex[:8]
    rids = [f"reset-{tag}-{k}" for k in "abc"]
    with cf.ThreadPoolExecutor(1) as ex:
        batch, _ = _until_one_runs_alone(url, ex, rids, 70, 60)
        assert http("POST", url + names.ROUTE_RESET)[0] == 200
        status, outs = batch.result()
    assert status == 200, outs
    time.sleep(1.0)
    got = {o["meta_info"]["id"]: (_req(url, o["meta_info"]["id"]), o["meta_info"]) for o in outs}
    print("after reset:", {rid: (r["prompt_tokens"], mi["prompt_tokens"], r["steps"], mi.get("spec_verify_ct"),
                                 mi.get("num_retractions")) for rid, (r, mi) in got.items() if r})
    resumed = [(r, mi) for r, mi in got.values() if r and r["retractions"]]
    assert resumed, got  # a retracted request prefilled again after the reset: the first the history saw
    assert all(r["prompt_tokens"] == mi["prompt_tokens"] for r, mi in resumed), got
    # one running at the reset was first seen at a decode step: its prompt is unknown, never wrong
    assert all(r["prompt_tokens"] in (None, mi["prompt_tokens"]) for r, mi in got.values() if r), got
    st, status_body = http("GET", url + names.ROUTE_STATUS)
    (rank,) = status_body["ranks"]
    a = rank["status"]["audit"]
    assert a["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), a["latest"]


def _aborted_counter(url: str) -> dict[str, float]:
    """``sglang_ctxprof_requests_aborted_total`` by kind, as SGLang's /metrics serves it."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(names.ABORT_KINDS, 0.0)
    for fam in text_string_to_metric_families(http("GET", url + "/metrics")[1]):
        for smp in fam.samples:
            if smp.name == names.METRIC_REQUESTS_ABORTED + "_total":
                out[smp.labels[names.LABEL_ABORT_KIND]] += smp.value
    return out


def _abort_events() -> dict[str, dict]:
    if not EVENTS.exists():
        return {}
    evs = (json.loads(ln) for ln in EVENTS.read_text().splitlines() if ln.strip())
    return {e["rid"]: e for e in evs if e.get("event") == names.EVENT_REQUEST_ABORTED}


def _wait(pred, what: str, limit_s: float = 60.0):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")
