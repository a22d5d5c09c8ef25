"""Exact accounting under load, on a real CPU server with EAGLE speculative decoding.

32 concurrent greedy requests with contexts from 64 to 3072 tokens and output lengths from 1 to 64
share batches that start and finish at different steps.  Afterwards the profile reconciles exactly
with what each client received (the documented rule, see ``records``):

* decode records of a request == ``meta_info.spec_verify_ct``;
* ``1 + committed == completion_tokens`` (the first token comes from prefill);
* ``accepted >= committed`` (the excess is what SGLang cut at the request's last step);
* the request's rows chain: each row's context = previous context + previous committed;
* nothing lost or double counted: bucket request-steps == sum of ``spec_verify_ct``, token totals
  == the per-request sums, and the back-pressure drop counter is 0.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

import ctxprof_ref
from conftest import generate, http, make_server_fixture, rand_ids
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

N = 32
DRAFT_TOKENS = 4  # cpu_args default --speculative-num-draft-tokens


def _args():
    # Room for all 32 at once, so SGLang never retracts (retraction is not what this test is about).
    return ctxprof_ref.model_args() + [names.CLI_FLAG, "--max-total-tokens", "65536",
                                       "--max-running-requests", "48"]


server = make_server_fixture("load-accounting", _args)


def _mix():
    ctx = [64 + (3072 - 64) * i // (N - 1) for i in range(N)]
    outs = [1, 2, 64, 5, 33, 17, 48, 9, 3, 60, 24, 40, 12, 7, 56, 29] * 2
    # interleave long and short contexts so neighbours in time differ
    order = [i // 2 if i % 2 == 0 else N - 1 - i // 2 for i in range(N)]
    return [(ctx[j], outs[k]) for k, j in enumerate(order)]


@pytest.fixture(scope="module")
def load(server):
    assert http("POST", server.url + "/ctx_profile/reset")[0] == 200
    mix = _mix()
    decoding = threading.Event()
    polls: list[int] = []

    def poller():  # snapshots under load; releases the second wave once decoding has begun
        t0 = time.time()
        while time.time() - t0 < 600 and not decoding.is_set():
            st, b = http("GET", server.url + "/ctx_profile")
            polls.append(st)
            if st == 200 and b["totals"]["decode_steps"] >= 3:
                decoding.set()
            time.sleep(0.3)

    def client(i, n, mt):
        if i % 2:  # second wave: joins batches that are already decoding
            decoding.wait(600)
        return generate(server.url, rand_ids(n, seed=500 + i), mt)

    with cf.ThreadPoolExecutor(N + 1) as ex:
        ex.submit(poller)
        futs = [ex.submit(client, i, n, mt) for i, (n, mt) in enumerate(mix)]
        outs = [f.result() for f in futs]
    assert decoding.is_set() and polls and all(st == 200 for st in polls), polls
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200, body
    reqs = {}
    for o in outs:
        rid = o["meta_info"]["id"]
        st, r = http("GET", f"{server.url}/ctx_profile/requests/{rid}")
        assert st == 200, (rid, r)
        reqs[rid] = r
    return mix, outs, body, reqs


def test_all_requests_completed(load):
    mix, outs, _, _ = load
    assert len(outs) == N
    for (n, mt), o in zip(mix, outs):
        assert o["meta_info"]["prompt_tokens"] == n
        assert o["meta_info"]["completion_tokens"] == mt


def verify_ct(mi: dict) -> int:
    """SGLang leaves ``spec_verify_ct`` out of meta_info when it is 0 (a one-token request)."""
    if "spec_verify_ct" not in mi:
        assert mi["completion_tokens"] == 1, mi
        return 0
    return mi["spec_verify_ct"]


def test_per_request_reconciliation(load):
    _, outs, _, reqs = load
    for o in outs:
        mi = o["meta_info"]
        r = reqs[mi["id"]]
        assert r["steps"] == verify_ct(mi), (mi, r)
        assert 1 + r["committed"] == mi["completion_tokens"], (mi, r)
        assert r["accepted"] >= r["committed"]
        assert r["prompt_tokens"] == mi["prompt_tokens"]
        rows = r["step_rows"]
        assert len(rows) == r["steps"] and r["steps_truncated"] == 0
        assert len({row["step_id"] for row in rows}) == len(rows), "a step counted twice"
        assert sum(row["committed"] for row in rows) == r["committed"]
        assert sum(row["accepted"] for row in rows) == r["accepted"]
        for a, b in zip(rows, rows[1:]):
            assert b["ctx_len"] == a["ctx_len"] + a["committed"], (a, b)
            assert b["step_id"] > a["step_id"]
        for row in rows:
            assert 1 <= row["accepted"] <= DRAFT_TOKENS and 0 <= row["committed"] <= row["accepted"]
        if rows:
            assert rows[0]["ctx_len"] == mi["prompt_tokens"] + 1


def test_totals_reconcile_nothing_lost_or_double_counted(load):
    _, outs, body, reqs = load
    total_verify = sum(verify_ct(o["meta_info"]) for o in outs)
    assert sum(b["req_steps"] for b in body["buckets"]) == total_verify
    assert body["totals"]["committed"] == sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    assert body["totals"]["accepted"] == sum(r["accepted"] for r in reqs.values())
    assert body["dropped"] == 0
    for rank in body["ranks"]:
        st = rank["status"]
        assert st["dropped"] == 0 and st["pending_evicted"] == 0 and st["unresolved"] == 0, st
    assert body["degraded"] is None


def test_batches_really_mixed(load):
    """The load produced shared batches of requests at different points of their lives."""
    _, _, body, reqs = load
    sizes = [row["batch_size"] for r in reqs.values() for row in r["step_rows"]]
    assert max(sizes) >= 8
    assert any(b["mean_batch_size"] > 1.5 for b in body["buckets"])
    firsts = sorted(r["step_rows"][0]["step_id"] for r in reqs.values() if r["step_rows"])
    lasts = sorted(r["step_rows"][-1]["step_id"] for r in reqs.values() if r["step_rows"])
    assert len(set(firsts)) > 1 and len(set(lasts)) > 1  # requests joined and left at different steps
