"""views/http_body: the ``/ctx_profile`` JSON body written from kept texts is byte for byte the body
``json_response(profile.to_dict())`` writes: one rank, several ranks with one that failed, a degraded
rank, non-finite numbers, and a second read of the same build."""

from __future__ import annotations

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import http, http_build
from sglang_ctxprof.views.http_guard import json_response


def _agg(n: int, seed: int) -> Aggregator:
    agg = Aggregator()
    for i in range(n):
        ctx = 100 + (37 * i + seed) % 5000
        attn = 0.5 + ctx / 2000 + (i % 7) * 0.01 + (400.0 if i % 53 == 7 else 0.0)  # a few slow steps
        ph = {"draft": 1.0, "verify": attn + 3.0, "verify_attn": attn, "verify_moe": 2.0, "verify_rest": 1.0,
              "draft_extend": 0.5, "overhead": 0.2}
        agg.observe(StepRecord(step_id=i, kind="prefill" if i % 40 == 0 else "decode", algorithm="EAGLE",
                               rank=RankId(), rids=(f"r{i % 5}",), ctx_lens=(ctx,), accepted=(2,), committed=(2,),
                               finished=(False,), draft_tokens=3, step_ms=attn + 4.7,
                               phases_ms=ph if i % 40 else {}, t_start_ns=10**18 + i * 20_000_000, timing="cpu"))
    return agg


def _answer(agg: Aggregator, pid: int, **status) -> dict:
    return {"state": agg.state(with_requests=False),
            "status": {"enabled": True, "dropped": 3, "pid": pid, "submitted": agg.records, **status}}


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    monkeypatch.setattr(http, "CACHE", http_build.BuildCache())


CASES = {
    "one rank": lambda: [_answer(_agg(300, 0), 7)],
    "two ranks and a failed one": lambda: [_answer(_agg(200, 1), 7), {"error": "timeout", "degraded": {"x": 1}},
                                           _answer(_agg(150, 2), 8, exporters={"spans_dropped": 2})],
    "degraded, non-finite": lambda: [_answer(_agg(120, 3), 9, degraded={"components": {"drain": "boom"}},
                                             load=float("nan"), hw={"peak": float("inf")})],
}


@pytest.mark.parametrize("case", CASES)
def test_the_spliced_body_is_the_plain_body_byte_for_byte(case):
    payloads = CASES[case]()
    for _ in range(2):  # the first read writes the texts, the second reuses them
        reply = http._profile_reply(payloads, "json")
        want = json_response(http.served_profile(payloads).to_dict()).body
        assert reply.body == want
        assert reply.media_type == "application/json" and reply.status_code == 200


def test_a_new_build_gets_new_texts():
    agg = _agg(100, 4)
    first = http._profile_reply([_answer(agg, 7)], "json").body
    for i in range(100, 130):
        agg.observe(StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("z",),
                               ctx_lens=(9000,), accepted=(1,), committed=(1,), finished=(False,), draft_tokens=3,
                               step_ms=50.0, phases_ms={"draft": 1.0, "verify": 49.0}, t_start_ns=10**18 + i))
    payloads = [_answer(agg, 7)]
    second = http._profile_reply(payloads, "json").body
    assert second != first and second == json_response(http.served_profile(payloads).to_dict()).body
    assert b'"decode_steps":' in second
