"""DP attention on the CPU (gloo): ``--tp-size 2 --dp-size 2 --enable-dp-attention``, plain decode.

Each DP rank runs its own requests through attention and both run the MoE together: a rank with no
request of its own runs an idle batch beside its peer's, which the profiler must not count.  Every
request SGLang served reconciles with what its rank recorded (prompt tokens, ``1 + committed`` ==
completion_tokens), the self-audit of both ranks stays at zero, and each DP rank exports its own
requests (its events, traces and live metrics: each is the first rank of its attention group).

Speculative decoding with DP attention failed here inside SGLang's CPU path (its EAGLE draft's rotary
embedding on an idle batch's zero tokens), and the decode-to-extend conversion of a decode batch beside a peer's
prefill needs CUDA prefill graphs: ``collect/adapter.batch_kind``'s handling of it is unit-tested.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from conftest import generate, http, rand_ids, start_server, tiny
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.model import names
from test_multirank import _gloo_env

pytestmark = pytest.mark.server


def test_dp_attention_requests_reconcile_on_both_ranks(tmp_path_factory):
    args = cpu_args(tiny("deepseek-v3")["target"]) + [
        names.CLI_FLAG, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--attention-backend", "intel_amx",
        "--enable-metrics"]
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", **_gloo_env(tmp_path_factory.mktemp("gloo-ep"))}
    srv = start_server("dp-attention", args, env=env)
    try:
        jobs = [(64, 20), (900, 24), (200, 16), (1500, 12), (300, 30), (50, 8)]
        with cf.ThreadPoolExecutor(3) as ex:  # arrivals overlap: one rank prefills while the other decodes
            metas = [o["meta_info"] for o in ex.map(
                lambda j: generate(srv.url, rand_ids(j[0], seed=j[0]), max_new_tokens=j[1]), jobs)]
        status, body = http("GET", srv.url + names.ROUTE_REQUESTS + "?slowest=50")
        assert status == 200, body
        ours = {r["rid"]: r for r in body["requests"]}
        for m in metas:
            r = ours[m["id"]]
            assert (r["prompt_tokens"], 1 + r["committed"], r["partial"]) == (
                m["prompt_tokens"], m["completion_tokens"], False), (m, r)
        ranks = http("GET", srv.url + names.ROUTE_STATUS)[1]["ranks"]
        assert sorted(rk["status"]["rank"]["dp"] for rk in ranks) == [0, 1]
        for rk in ranks:
            audit = rk["status"]["audit"]
            assert audit["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), audit["latest"]
            assert audit["checked"]["requests"] > 0  # each rank served some of them
        # the sinks run a few records behind a read: wait until they have seen every request
        deadline, exported = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            exported = [rk["status"]["exporters"] for rk in http("GET", srv.url + names.ROUTE_STATUS)[1]["ranks"]]
            if sum(e["requests_finished"] for e in exported) >= len(metas):
                break
            time.sleep(0.5)
        assert sum(e["requests_finished"] for e in exported) == len(metas), exported
        assert all(e["requests_finished"] > 0 and e["metrics"] for e in exported), exported
    finally:
        srv.stop()
