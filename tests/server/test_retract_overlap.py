"""Retraction under the overlap scheduler, on a real CPU server (tiny Qwen3-MoE, plain decode:
SGLang keeps overlap on here without speculation), with SGLang's retraction test switch.

``SGLANG_TEST_RETRACT=1`` retracts one running request every 3 forward steps.  Under overlap the
next batch is launched before the last one's result: SGLang may retract a request whose prefill is
still in flight (it has the fewest outputs: the first one retracted), skip that prefill's row, and
prefill it again with no output, so no token says it was retracted.  SGLang's own count does
(``num_retractions``), and so must ours: per request, and per prefill bucket in the totals.  Rounds
of six requests, arriving 0.15 s apart, run until such a retraction happened (SGLang counted more
retractions than re-prefills appended tokens), each finished request reconciling all along.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from conftest import http, rand_ids, start_server, tiny
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

ROUNDS = 20  # at most: a round's requests arrive 0.15 s apart, so prefills keep landing between decode
# steps, and each one may be in flight at a retraction (seen within 1-5 rounds of six at once)


@pytest.fixture(scope="module")
def server():
    srv = start_server("retract-overlap", cpu_args(tiny("qwen3-moe")["target"]) + [names.CLI_FLAG],
                       env={"SGLANG_TEST_RETRACT": "1"})
    try:
        yield srv
    finally:
        srv.stop()


def _gen(url: str, i: int) -> dict:
    body = {"input_ids": rand_ids(60 + 37 * i, seed=500 + i), "rid": f"ro-{i}",
            "sampling_params": {"max_new_tokens": 12 + i % 5, "temperature": 0, "ignore_eos": True}}
    status, out = http("POST", url + "/generate", body)
    assert status == 200, out
    return out["meta_info"]


def test_every_retraction_is_counted_also_one_that_hit_a_prefill_in_flight(server):
    url = server.url
    assert http("POST", url + names.ROUTE_RESET)[0] == 200
    metas: list[dict] = []
    in_flight = 0
    for rnd in range(ROUNDS):
        with cf.ThreadPoolExecutor(6) as ex:
            futs = []
            for i in range(6 * rnd, 6 * rnd + 6):
                futs.append(ex.submit(_gen, url, i))
                time.sleep(0.15)
            metas += [f.result() for f in futs]
        time.sleep(1.0)  # the drain thread
        for m in metas[-6:]:
            status, r = http("GET", f"{url}{names.ROUTE_REQUESTS}/{m['id']}")
            assert status == 200, r
            assert r["retractions"] == m.get("num_retractions", 0), (m, r)
            assert 1 + r["committed"] == m["completion_tokens"] and r["prompt_tokens"] == m["prompt_tokens"], (m, r)
            in_flight += r["retractions"] - (r["committed"] - r["steps"])  # plain: a step commits one token
        if in_flight:
            break
    print(f"retractions {sum(m.get('num_retractions', 0) for m in metas)} over {len(metas)} requests, "
          f"{in_flight} of them of a prefill in flight, after {rnd + 1} round(s)")
    assert in_flight > 0  # the case this test is for happened
    body = http("GET", url + names.ROUTE)[1]
    assert body["totals"]["retractions"] == sum(m.get("num_retractions", 0) for m in metas)
    status, st = http("GET", url + names.ROUTE_STATUS)
    audit = st["ranks"][0]["status"]["audit"]
    assert audit["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), audit["latest"]
