"""On a real CPU server: tiny DeepSeek-V3 (MLA + MoE) with the identity EAGLE head.

Checks the per-bucket phase breakdown, that leaf phases add up to the step span, and that the
profile reconciles exactly with what SGLang reported to the clients (meta_info), also for
several concurrent requests sharing batches.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time

import pytest

from conftest import generate, http, make_server_fixture, rand_ids, tiny
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server


def _args():
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    return cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile"]


server = make_server_fixture("core-dsv3-eagle", _args)

CTX = (64, 1024, 3072)


@pytest.fixture(scope="module")
def traffic(server):
    assert http("POST", server.url + "/ctx_profile/reset")[0] == 200
    outs = [generate(server.url, rand_ids(n, seed=n), max_new_tokens=30) for n in CTX]
    with cf.ThreadPoolExecutor(4) as ex:  # concurrent requests of different lengths share batches
        futs = [ex.submit(generate, server.url, rand_ids(n, seed=100 + i), mt)
                for i, (n, mt) in enumerate([(100, 21), (700, 37), (1500, 13), (300, 50)])]
        outs += [f.result() for f in futs]
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200, body
    return outs, body


def test_buckets_and_phases(traffic):
    _, body = traffic
    assert body["schema_version"] == 1 and body["enabled"] is True
    assert body["timing"] == "cpu" and body["algorithms"] == ["EAGLE"]
    labels = {b["label"]: b for b in body["buckets"]}
    for want in ("64-127", "1024-2047", "2048-4095"):
        assert want in labels, labels.keys()
    for b in body["buckets"]:
        for phase in ("draft", "verify", "verify_attn", "verify_moe", "verify_rest", "draft_extend"):
            assert b["phases"][phase]["mean_ms"] > 0, (b["label"], phase)
        assert b["accepted_per_step"] > 1.5  # identity head: realistic acceptance
        assert b["decode_tok_s"] > 0


def test_leaf_phases_add_up_to_step(traffic):
    _, body = traffic
    for b in body["buckets"]:
        ph = b["phases"]
        leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
        assert leaves == pytest.approx(ph["step"]["total_ms"], rel=1e-6, abs=1e-6)
        verify_parts = ph["verify_attn"]["total_ms"] + ph["verify_moe"]["total_ms"] + ph["verify_rest"]["total_ms"]
        assert verify_parts == pytest.approx(ph["verify"]["total_ms"], rel=1e-6)


def test_exact_accounting_per_request(server, traffic):
    outs, body = traffic
    total_steps = 0
    for out in outs:
        mi = out["meta_info"]
        status, r = http("GET", f"{server.url}/ctx_profile/requests/{mi['id']}")
        assert status == 200, r
        assert r["steps"] == mi["spec_verify_ct"]
        assert 1 + r["committed"] == mi["completion_tokens"]  # first token comes from prefill
        assert r["accepted"] >= r["committed"]
        assert r["prompt_tokens"] == mi["prompt_tokens"]
        assert len(r["step_rows"]) == r["steps"]
        assert r["step_rows"][0]["ctx_len"] == mi["prompt_tokens"] + 1
        total_steps += r["steps"]
    # nothing double counted: request-steps in the buckets equal the per-request sums
    assert sum(b["req_steps"] for b in body["buckets"]) == total_steps
    assert body["dropped"] == 0


def test_profiler_reports_its_own_cost(server, traffic):
    """Each rank states its price: scheduler-thread µs per step (timed on sampled steps), drain µs
    per record, GPU events per step (None on the CPU clock), and as shares of the mean step: the
    total counts the drain thread's work too (it shares the scheduler's GIL), not the scheduler
    thread's alone; the text view prints it in one line."""
    status, st = http("GET", server.url + "/ctx_profile/status")
    assert status == 200, st
    cost = st["ranks"][0]["status"]["cost"]
    assert cost["sampled_steps"] >= 1 and cost["sched_us_per_step"] > 0 and cost["step_share"] > 0
    assert cost["drain_us_per_record"] > 0 and cost["events_per_step"] is None
    assert cost["drain_share"] > 0 and cost["total_share"] == pytest.approx(cost["step_share"] + cost["drain_share"])
    _, body = http("GET", server.url + "/ctx_profile")
    assert body["ranks"][0]["status"]["cost"]["sampled_steps"] >= cost["sampled_steps"]
    _, text = http("GET", server.url + "/ctx_profile?format=text")
    assert re.search(r"profiler cost: \d+\.\d% of the step in the scheduler's process: \d+ µs/step on the scheduler thread "
                     r"\(\d+\.\d%\), drain thread \d+ µs/record \(\d+\.\d%\)", text), text


def test_an_idle_servers_state_is_sent_once(server, traffic):
    """A read names the states it holds: the scheduler of an idle server answers its state unchanged
    instead of writing and sending it again, and the profile read is the same."""
    _, a = http("GET", server.url + "/ctx_profile")
    _, b = http("GET", server.url + "/ctx_profile")
    sa, sb = (x["ranks"][0]["status"]["states"] for x in (a, b))
    assert sb["unchanged"] == sa["unchanged"] + 1 and sb["written"] == sa["written"], (sa, sb)
    assert b["buckets"] == a["buckets"] and b["totals"] == a["totals"]
    assert http("GET", server.url + "/ctx_profile/diagnosis")[0] == 200
    _, st = http("GET", server.url + "/ctx_profile/status")
    assert st["ranks"][0]["status"]["states"] == {"written": sb["written"], "unchanged": sb["unchanged"] + 1}


def test_text_format_and_reset(server, traffic):
    status, text = http("GET", server.url + "/ctx_profile?format=text")
    assert status == 200 and "2048-4095" in text and "v.attn ms" in text
    assert http("POST", server.url + "/ctx_profile/reset")[0] == 200
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200 and body["buckets"] == [] and body["totals"]["decode_steps"] == 0


def _drain_state(server) -> str:
    return http("GET", server.url + "/ctx_profile/status")[1]["ranks"][0]["status"]["drain"]


def test_runtime_disable_removes_hooks_and_enable_restores_them(server, traffic):
    """POST /ctx_profile/disable uninstalls every timing hook (off costs nothing); enable re-installs."""
    assert http("POST", server.url + "/ctx_profile/disable")[0] == 200
    assert http("POST", server.url + "/ctx_profile/reset")[0] == 200
    generate(server.url, rand_ids(200, seed=5), max_new_tokens=12)
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200 and body["enabled"] is False and body["totals"]["decode_steps"] == 0
    # and no thread of ours runs while off: the drain thread ends once it has nothing left
    deadline = time.monotonic() + 30
    while _drain_state(server) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _drain_state(server) == "stopped"
    assert http("POST", server.url + "/ctx_profile/enable")[0] == 200
    assert _drain_state(server) == "running"
    out = generate(server.url, rand_ids(200, seed=6), max_new_tokens=12)
    status, r = http("GET", f"{server.url}/ctx_profile/requests/{out['meta_info']['id']}")
    assert status == 200 and r["steps"] == out["meta_info"]["spec_verify_ct"] > 0
    assert 1 + r["committed"] == out["meta_info"]["completion_tokens"]


def test_status_reports_which_model_classes_are_hooked(traffic, server):
    st = http("GET", server.url + "/ctx_profile/status")[1]
    rank = st["ranks"][0]["status"]
    cov = rank["coverage"]
    assert cov["available"] and cov["model"].startswith("Deepseek"), cov
    assert cov["attn"].get("RadixAttention", 0) >= 1
    assert cov["moe"].get("DeepseekV2MoE", 0) >= 1 and cov["moe_unhooked"] == {}, cov
    assert rank["split"]["mode"] == "block_events"  # CPU: no graphs, no timed copies
