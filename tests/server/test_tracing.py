"""On a real CPU server: tail-sampled OTel spans, trace context, structlog events, /metrics.

A real OTLP/HTTP receiver runs in the test (decoding ``ExportTraceServiceRequest`` with the official
``opentelemetry-proto`` package).  The server runs the tiny DeepSeek-V3 + identity EAGLE head with
``--enable-ctx-profile --enable-metrics --enable-trace``; SGLang's own tracer and ours both export to
the receiver over http/protobuf.

No timing threshold is hard-coded: a first round (nothing is "slow" yet) measures the decode tok/s
of the short requests and of one long-context request; the slow threshold is then set at run time
(``POST /ctx_profile/trace_policy``) to the geometric mean of the two, and a second round with the
same shapes must export exactly the long one.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time

import pytest

from conftest import LOG_DIR, generate, http, rand_ids, start_server, tiny
from otlp_receiver import Receiver
from sglang_ctxprof.model import names
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

FAST = (24, 40, 56)
SLOW_CTX = 8000  # the tiny models' context is 8192
NEW_TOKENS = 24


def _wait(pred, timeout=120.0, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------------------------- server
EVENTS = LOG_DIR / "tracing-events.jsonl"
RECEIVER: Receiver = None  # type: ignore[assignment]  # set by the module fixture


def _args():
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    return cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + [
        "--enable-ctx-profile", "--enable-metrics", "--enable-trace",
        "--otlp-traces-endpoint", RECEIVER.endpoint]


def _env():
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    if EVENTS.exists():
        EVENTS.unlink()
    return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": RECEIVER.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2", "OTEL_BSP_SCHEDULE_DELAY": "200",
            "SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS": "200",
            "OTEL_SERVICE_NAME": "ctxprof-test",
            "SGLANG_CTXPROF_TRACE": "slow", "SGLANG_CTXPROF_SLOW_TOK_S": "0", "SGLANG_CTXPROF_SLOW_STEP_MS": "0",
            "SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": str(EVENTS),
            "SGLANG_CTXPROF_LOG_SUMMARY_S": "2"}


@pytest.fixture(scope="module")
def server():
    global RECEIVER
    RECEIVER = Receiver()
    srv = start_server("tracing-dsv3-eagle", _args(), env=_env())
    try:
        yield srv
    finally:
        srv.stop()
        RECEIVER.stop()


SENT = [0]  # generate calls so far (each one finishes with decode steps)


def _round(url, seed, traceparent=None):
    SENT[0] += len(FAST) + 1
    fast = [generate(url, rand_ids(n, seed=seed + i), NEW_TOKENS) for i, n in enumerate(FAST)]
    hdr = {"traceparent": traceparent} if traceparent else None
    slow = generate(url, rand_ids(SLOW_CTX, seed=seed + 50), NEW_TOKENS, headers=hdr)
    return fast, slow


def _tok_s(url, out):
    status, r = http("GET", f"{url}/ctx_profile/requests/{out['meta_info']['id']}")
    assert status == 200, r
    return r["decode_tok_s"]


def _finished(url) -> int:
    status, body = http("GET", url + names.ROUTE_TRACE_POLICY)
    assert status == 200, body
    return body["ranks"][0]["requests_finished"]


@pytest.fixture(scope="module")
def traced(server):
    url = server.url
    _round(url, 500)  # warm-up: first requests pay one-off start costs (--skip-server-warmup)
    # Round 1 (nothing is slow yet): measure.  On a machine shared with other CPU-heavy work the fixed
    # per-step overhead can swamp the context effect; then wait and measure again.
    for attempt in range(5):
        fast1, slow1 = _round(url, 1000 + 100 * attempt)
        fast_min = min(_tok_s(url, o) for o in fast1)
        slow_v = _tok_s(url, slow1)
        if slow_v * 1.5 < fast_min:
            break
        time.sleep(10)
    else:
        pytest.fail(f"long context ({slow_v:.1f} tok/s) not clearly slower than short ({fast_min:.1f})")
    time.sleep(1.0)
    assert RECEIVER.ours() == [], "nothing is slow in round 1, so nothing may be exported"
    thr = math.sqrt(slow_v * fast_min)
    status, pol = http("POST", url + names.ROUTE_TRACE_POLICY, {"mode": "slow", "slow_tok_s": thr})
    assert status == 200 and pol["trace_policy"]["slow_tok_s"] == pytest.approx(thr), pol
    # Round 2 under the slow policy; the last request of a round carries a client traceparent.
    sent: list[dict] = []
    for attempt in range(3):
        trace_id = secrets.token_hex(16)
        tp = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        fast2, slow2 = _round(url, 2000 + 100 * attempt, traceparent=tp)
        sent += fast2 + [slow2]
        _wait(lambda: _finished(url) >= SENT[0], what="the tail decisions")
        rates = {o["meta_info"]["id"]: _tok_s(url, o) for o in fast2 + [slow2]}
        rid = slow2["meta_info"]["id"]
        if [r for r, v in rates.items() if v < thr] == [rid]:  # this round's rates separate
            _wait(lambda: [s for s in RECEIVER.ours() if s["attrs"][names.ATTR_RID] == rid],
                  what="the slow request's span")
            break
        time.sleep(10)
    else:
        pytest.fail(f"round-2 rates never separated around {thr:.1f} tok/s: {rates}")
    time.sleep(1.0)
    # The tail decision is exactly the policy applied to each finished request's measured rate.
    want = {o["meta_info"]["id"] for o in sent if _tok_s(url, o) < thr}
    assert {s["attrs"][names.ATTR_RID] for s in RECEIVER.ours()} == want
    return {"fast": fast1 + fast2, "slow": slow2, "slow1": slow1, "rid": rid, "trace_id": trace_id,
            "threshold": thr, "rates": (slow_v, fast_min), "exported": want}


def test_exactly_the_slow_request_is_exported_with_its_steps(traced):
    (req,) = [s for s in RECEIVER.ours() if s["attrs"][names.ATTR_RID] == traced["rid"]]
    mi = traced["slow"]["meta_info"]
    assert req["attrs"][names.ATTR_RID] == traced["rid"]
    assert req["attrs"][names.ATTR_PROMPT_TOKENS] == mi["prompt_tokens"] == SLOW_CTX
    assert req["attrs"][names.ATTR_OUTPUT_TOKENS] == mi["completion_tokens"]
    assert req["attrs"][names.ATTR_DECODE_TOK_S] < traced["threshold"]
    assert req["attrs"][names.ATTR_ACCEPT_MEAN] > 1.0 and "decode_tok_s" in req["attrs"][names.ATTR_SLOW_REASON]
    assert req["service"] == "ctxprof-test"
    steps = [s for s in RECEIVER.ours(names.SPAN_STEP) if s["parent"] == req["span_id"]]
    assert len(steps) == mi["spec_verify_ct"] == req["attrs"][names.ATTR_STEPS]
    assert len(RECEIVER.ours()) == len(traced["exported"])  # only requests the policy called slow
    steps.sort(key=lambda s: s["start"])
    assert steps[0]["attrs"][names.ATTR_CTX_LEN] == mi["prompt_tokens"] + 1
    ctx = [s["attrs"][names.ATTR_CTX_LEN] for s in steps]
    assert ctx == sorted(ctx) and len(set(ctx)) == len(ctx)
    assert sum(s["attrs"][names.ATTR_COMMITTED] for s in steps) + 1 == mi["completion_tokens"]
    by_parent: dict[str, list[dict]] = {}
    for s in RECEIVER.spans:
        by_parent.setdefault(s["parent"], []).append(s)
    for st in steps:
        a = st["attrs"]
        assert a[names.ATTR_BATCH_SIZE] == 1 and a[names.ATTR_DRAFT_TOKENS] == 4 and a[names.ATTR_ACCEPTED] >= 1
        assert a[names.ATTR_CTX_BUCKET] == "4096-8191"
        kids = sorted(by_parent[st["span_id"]], key=lambda s: s["start"])
        assert [k["name"] for k in kids][:3] == ["ctxprof.draft", "ctxprof.verify", "ctxprof.draft_extend"]
        assert kids[0]["start"] == st["start"] and kids[-1]["end"] <= st["end"]
        verify = kids[1]
        vk = sorted(by_parent[verify["span_id"]], key=lambda s: s["start"])
        assert [k["attrs"][names.ATTR_PHASE] for k in vk] == ["verify_attn", "verify_moe", "verify_rest"]
        assert vk[0]["start"] == verify["start"] and vk[-1]["end"] == verify["end"]
        assert all(k["end"] >= k["start"] for k in kids + vk)


def test_traceparent_joins_the_clients_trace_under_sglangs_request_span(traced):
    (req,) = [s for s in RECEIVER.ours() if s["attrs"][names.ATTR_RID] == traced["rid"]]
    ours = [s for s in RECEIVER.spans if s["scope"] == names.TRACER_NAME and s["trace_id"] == req["trace_id"]]
    assert req["trace_id"] == traced["trace_id"]
    assert len(ours) > 1 and all(s["trace_id"] == traced["trace_id"] for s in ours)
    _wait(lambda: [s for s in RECEIVER.spans if s["span_id"] == req["parent"]], 60, "SGLang's request span")
    parent = [s for s in RECEIVER.spans if s["span_id"] == req["parent"]]
    assert parent[0]["scope"] != names.TRACER_NAME and "Req" in parent[0]["name"]
    assert parent[0]["trace_id"] == traced["trace_id"]


def test_slow_request_log_event_and_sglang_log_format(server, traced):
    def events():
        if not EVENTS.exists():
            return []
        return [json.loads(x) for x in EVENTS.read_text().splitlines() if x.strip()]

    slow_ev = _wait(lambda: [e for e in events() if e["event"] == names.EVENT_SLOW_REQUEST], 30, "slow_request")
    assert {e["rid"] for e in slow_ev} == traced["exported"]
    (e,) = [e for e in slow_ev if e["rid"] == traced["rid"]]
    assert e["traced"] is True and e["prompt_tokens"] == SLOW_CTX and e["level"] == "warning"
    assert e["steps"] == traced["slow"]["meta_info"]["spec_verify_ct"]
    summ = _wait(lambda: [x for x in events() if x["event"] == names.EVENT_SUMMARY], 30, "ctx_profile_summary")
    assert summ[0]["level"] == "info" and summ[0]["steps"] > 0
    log = (LOG_DIR / "tracing-dsv3-eagle.log").read_text(errors="replace")
    assert names.EVENT_SLOW_REQUEST not in log  # our events go to their own destination
    prefill = [ln for ln in log.splitlines() if "Prefill batch" in ln]
    assert prefill and all(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ln) for ln in prefill)


def test_metrics_parse_with_bounded_labels(server, traced):
    from prometheus_client.parser import text_string_to_metric_families

    status, text = http("GET", server.url + "/metrics")
    assert status == 200
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    h = fam[names.METRIC_PHASE_SECONDS]
    assert h.type == "histogram"
    status, body = http("GET", server.url + "/ctx_profile")
    allowed = {b["label"] for b in body["buckets"]}
    labels = {(s.labels["phase"], s.labels["ctx_bucket"]) for s in h.samples if s.name.endswith("_count")}
    assert {p for p, _ in labels} <= set(names.REPORTED_PHASES) and ("verify_moe", "4096-8191") in labels
    assert {b for _, b in labels} == allowed
    steps = sum(s.value for s in fam[names.METRIC_STEPS].samples if s.name.endswith("_total"))
    assert steps == body["totals"]["decode_steps"]
    acc = sum(s.value for s in fam[names.METRIC_ACCEPTED].samples if s.name.endswith("_total"))
    assert acc == body["totals"]["accepted"]
    status, text2 = http("GET", server.url + "/ctx_profile?format=prometheus")
    fam2 = {f.name: f for f in text_string_to_metric_families(text2)}
    assert sum(s.value for s in fam2[names.METRIC_STEPS].samples) == steps


def test_trace_cli_and_slowest_view(server, traced, capsys):
    from sglang_ctxprof.cli.main import main

    assert main(["trace", "--url", server.url, traced["rid"]]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s+1\s+4\s", ln)]
    assert len(rows) == traced["slow"]["meta_info"]["spec_verify_ct"]
    assert f"request {traced['rid']}" in out and traced["trace_id"] in out
    status, body = http("GET", server.url + "/ctx_profile/requests?slowest=2&steps=1")
    rows = body["requests"]
    assert status == 200 and len(rows) == 2 and rows[0]["decode_tok_s"] <= rows[1]["decode_tok_s"]
    assert all(len(r["step_rows"]) == r["steps"] > 0 for r in rows)  # full step-by-step breakdown
    status, lean = http("GET", server.url + "/ctx_profile/requests?slowest=2")
    assert [r["rid"] for r in lean["requests"]] == [r["rid"] for r in rows]
    assert not any("step_rows" in r for r in lean["requests"])  # by default, no step rows
    status, allr = http("GET", server.url + "/ctx_profile/requests?slowest=1000")
    assert rows[1]["decode_tok_s"] <= min(r["decode_tok_s"] for r in allr["requests"][2:])
    assert main(["trace", "--url", server.url, "--slowest", "1", "--max-steps", "3"]) == 0
    assert "more steps" in capsys.readouterr().out


def test_collector_down_costs_only_drops(server, traced):
    RECEIVER.stop()
    status, pol = http("POST", server.url + names.ROUTE_TRACE_POLICY, {"mode": "all"})
    assert status == 200 and pol["trace_policy"]["mode"] == "all"
    outs = [generate(server.url, rand_ids(n, seed=3000 + n), NEW_TOKENS) for n in FAST]
    assert all(o["meta_info"]["completion_tokens"] == NEW_TOKENS for o in outs)
    body = _wait(lambda: (lambda b: b if b.get("spans_dropped", 0) > 0 else None)(
        http("GET", server.url + "/ctx_profile")[1]), 120, "drop count")
    st = body["ranks"][0]["status"]["exporters"]
    assert st["otel"]["failed_batches"] >= 1 and st["requests_traced"] >= len(outs) + 1
    assert http("GET", server.url + "/health")[0] == 200
    assert http("POST", server.url + names.ROUTE_TRACE_POLICY, {"mode": "sometimes"})[0] == 400
