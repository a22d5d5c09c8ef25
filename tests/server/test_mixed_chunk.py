"""Exact accounting on a real CPU server with mixed chunked prefill and the overlap scheduler.

``--enable-mixed-chunk`` runs the requests that are decoding inside another request's prefill step
(a MIXED batch, SGLang's ``mix_with_running``): their rows append one token on top of earlier
output, as a retracted request's re-prefill does, but they are no retraction.  With overlap on
(SGLang's default) a request that finished at one step still rides the next one, and a chunk in flight
when its request was aborted comes back after the abort: SGLang skips those rows, and so must we, or
the rid gets a second "use" that hides the real one.  A request that keeps no output
(``max_new_tokens=0``, and the warm-up SGLang's tokenizer sends before an n>1 request) finishes with
``completion_tokens`` 0.  Every request reconciles, and the self-audit stays at 0.

Tiny Qwen3-MoE, no speculative decoding, chunks of 64 tokens.
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest import http, rand_ids, start_server, tiny
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server():
    args = cpu_args(tiny("qwen3-moe")["target"]) + [names.CLI_FLAG, "--enable-mixed-chunk",
                                                    "--chunked-prefill-size", "64"]
    srv = start_server("mixed-chunk", args)
    try:
        yield srv
    finally:
        srv.stop()


def _gen(url: str, out: dict, key: str, body: dict) -> threading.Thread:
    t = threading.Thread(target=lambda: out.update({key: http("POST", url + "/generate", body)}))
    t.start()
    return t


def _sp(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def _ours(url: str, rid: str) -> dict:
    status, body = http("GET", f"{url}{names.ROUTE_REQUESTS}/{rid}")
    assert status == 200, body
    return body


def _reconciles(url: str, meta: dict) -> dict:
    r = _ours(url, meta["id"])
    assert r["use"] == 0 and r["finished"], r
    assert 1 + r["committed"] == meta["completion_tokens"], (r, meta)
    assert r["prompt_tokens"] == meta["prompt_tokens"] and r["retractions"] == meta.get("num_retractions", 0)
    return r


def _until(url: str, rid: str, ok, limit_s: float = 120.0) -> None:
    """Wait until the profiler's entry of ``rid`` satisfies ``ok`` (polled every 20 ms)."""
    t0 = time.time()
    while time.time() - t0 < limit_s:
        status, body = http("GET", f"{url}{names.ROUTE_REQUESTS}/{rid}")
        if status == 200 and ok(body):
            return
        time.sleep(0.02)
    raise AssertionError(f"{rid}: not reached in {limit_s} s")


@pytest.fixture(scope="module")
def run(server):
    """Decode beside chunked prefills; a client abort mid-decode and an abort mid-prefill beside them."""
    url = server.url
    assert http("POST", url + names.ROUTE_RESET)[0] == 200
    out: dict = {}
    a = _gen(url, out, "mix", {"input_ids": rand_ids(32, 1), "sampling_params": _sp(200), "rid": "mix-a"})
    _until(url, "mix-a", lambda r: r["steps"] >= 3)  # decoding: the next prefill mixes it in
    b = _gen(url, out, "long", {"input_ids": rand_ids(700, 2), "sampling_params": _sp(4), "rid": "mix-b"})
    a.join(300), b.join(300)
    c = _gen(url, out, "cut", {"input_ids": rand_ids(32, 11), "sampling_params": _sp(400), "rid": "cut-a"})
    _until(url, "cut-a", lambda r: r["steps"] >= 3)
    d = _gen(url, out, "beside", {"input_ids": rand_ids(2500, 12), "sampling_params": _sp(3), "rid": "cut-b"})
    _until(url, "cut-b", lambda r: not r["finished"])  # its first chunk ran: cut-a now rides mixed batches
    assert http("POST", url + "/abort_request", {"rid": "cut-a"})[0] == 200
    c.join(300), d.join(300)
    e = _gen(url, out, "chunked", {"input_ids": rand_ids(4000, 4), "sampling_params": _sp(8), "rid": "chunk-ab"})
    _until(url, "chunk-ab", lambda r: not r["finished"] and r["steps"] == 0)  # between two of its chunks
    assert http("POST", url + "/abort_request", {"rid": "chunk-ab"})[0] == 200
    e.join(300)
    out["zero"] = http("POST", url + "/generate", {"input_ids": rand_ids(40, 3), "rid": "zero",
                                                   "sampling_params": {"max_new_tokens": 0}})
    out["n2"] = http("POST", url + "/generate", {"text": "hello there friend",
                                                 "sampling_params": {"max_new_tokens": 5, "n": 2, "temperature": 0.7}})
    for key, (status, body) in out.items():
        assert status == 200, (key, body)
    time.sleep(1.0)  # the drain thread
    return out


def test_decode_rows_in_mixed_batches_are_no_retractions(server, run):
    mixed = _reconciles(server.url, run["mix"][1]["meta_info"])
    assert mixed["steps"] < mixed["committed"]  # tokens decoded inside mix-b's prefill batches: no steps of ours
    _reconciles(server.url, run["long"][1]["meta_info"])
    status, body = http("GET", server.url + names.ROUTE)
    assert status == 200 and body["totals"]["retractions"] == 0, body["totals"]
    assert sum(b["decoded"] for b in body["prefill"]) >= mixed["committed"] - mixed["steps"]  # and others'


def test_a_request_aborted_mid_decode_beside_a_chunked_prefill_keeps_its_one_use(server, run):
    meta = run["cut"][1]["meta_info"]
    _reconciles(server.url, meta)
    assert meta["finish_reason"]["type"] == "abort"


def test_a_request_aborted_mid_chunked_prefill_ends_once(server, run):
    r = _ours(server.url, "chunk-ab")
    assert r["use"] == 0 and r["finished"] and r["committed"] == 0, r


def test_requests_that_keep_no_output_and_the_whole_run_leave_the_audit_clean(server, run):
    assert run["zero"][1]["meta_info"]["completion_tokens"] == 0
    assert _ours(server.url, "zero")["finished"]
    status, st = http("GET", server.url + names.ROUTE_STATUS)
    assert status == 200
    audit = st["ranks"][0]["status"]["audit"]
    assert audit["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), audit["latest"]
    assert audit["checked"]["requests"] >= 6, audit


def test_prefill_buckets_hold_the_prompts_alone(server, run):
    """The decode rows riding a mixed batch are no prompt: mix-b's chunks (a 700-token prompt, with
    mix-a decoding beside them) land in the 512-1023 bucket, not pulled down to 256-511 by mix-a's
    short context; every bucket's mean is a prompt's length (the prompts: 5-40, 700, 2500, 4000)."""
    status, body = http("GET", server.url + names.ROUTE)
    assert status == 200
    means = {b["label"]: b["tokens"] / b["requests"] for b in body["prefill"] if b["requests"]}  # 0: chunks only
    assert not [label for label, m in means.items() if 64 <= m < 512], means


def test_a_prefix_cache_hit_counts_once_over_a_prompts_chunks(server, run):
    """SGLang's ``cached_tokens`` is a request's running total, found at its first chunk: a prompt
    in several chunks counts its hit once, as SGLang's ``meta_info`` does.  (Runs last: it resets.)"""
    url = server.url
    assert http("POST", url + names.ROUTE_RESET)[0] == 200
    shared = rand_ids(200, 31)
    metas = []
    for rid, ids, n in (("warm", shared, 1), ("hit", shared + rand_ids(300, 32), 2)):
        status, out = http("POST", url + "/generate", {"input_ids": ids, "rid": rid, "sampling_params": _sp(n)})
        assert status == 200, out
        metas.append(out["meta_info"])
    time.sleep(1.0)  # the drain thread
    assert metas[1]["cached_tokens"] > 0, metas
    body = http("GET", url + names.ROUTE)[1]
    ours = sum(b["cached_tokens"] for b in body["prefill"])
    print("cached tokens, ours / SGLang's:", ours, sum(m["cached_tokens"] for m in metas))
    assert ours == sum(m["cached_tokens"] for m in metas), body["prefill"]
    # each prompt once over its chunks of 64: the hit ratio is SGLang's (cached / prompt tokens)
    assert sum(b["requests"] for b in body["prefill"]) == 2, body["prefill"]
    assert sum(b["tokens"] for b in body["prefill"]) == sum(m["prompt_tokens"] for m in metas), body["prefill"]
