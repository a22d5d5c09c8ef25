"""Multi-rank SGLang on the CPU (gloo): ``--dp-size 2`` and ``--tp-size 2``.

* dp2: two scheduler processes, each answering /ctx_profile for its DP group.  The response lists
  both ranks (dp 0 and dp 1, each with its own requests) and a merged view whose counts and phase
  totals are exactly the sums of the ranks', and which reconciles with what SGLang told clients.
* tp2: two TP ranks run every step together; SGLang's control channel is answered by TP rank 0
  only, so /ctx_profile shows one rank (tp 0) speaking for the TP group.

What this machine needs (SGLang 0.5.23, 1 NUMA node, no CUDA): ``SGLANG_CPU_OMP_THREADS_BIND`` (one
core per rank), and for tp2 the test-only plugin tests/plugins/cpu_tp_gloo (SGLang creates PyNccl
groups on CPU otherwise: "Expected a cuda device, but got: cpu").
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from conftest import ROOT, generate, http, rand_ids, start_server, tiny, write_dist_info
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

GLOO = ROOT / "tests" / "plugins" / "cpu_tp_gloo"
PHASES = ("step", "draft", "verify", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead")


def _gloo_env(tmp) -> dict:
    import sys

    sys.path.insert(0, str(GLOO))
    try:
        import cpu_tp_gloo
    finally:
        sys.path.remove(str(GLOO))
    write_dist_info(str(tmp), cpu_tp_gloo.__name__)
    return {"PYTHONPATH": f"{GLOO}:{tmp}"}


@pytest.fixture(scope="module", params=["dp2", "tp2"])
def run(request, tmp_path_factory):
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    flag = "--dp-size" if request.param == "dp2" else "--tp-size"
    args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile", flag, "2"]
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    if request.param == "tp2":
        env.update(_gloo_env(tmp_path_factory.mktemp("gloo-ep")))
    srv = start_server(f"multirank-{request.param}", args, env=env)
    try:
        jobs = [(64, 20), (900, 24), (200, 16), (1500, 12)]
        with cf.ThreadPoolExecutor(2) as ex:
            outs = list(ex.map(lambda j: generate(srv.url, rand_ids(j[0], seed=j[0]), max_new_tokens=j[1]), jobs))
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200, body
        yield request.param, outs, body
    finally:
        srv.stop()


def _totals(buckets):
    t = {"steps": 0, "req_steps": 0, "committed": 0}
    ph = {p: 0.0 for p in PHASES}
    for b in buckets:
        t["steps"] += b["steps"]
        t["req_steps"] += b["req_steps"]
        t["committed"] += b["committed"]
        for p in PHASES:
            ph[p] += b["phases"][p]["total_ms"]
    return t, ph


def test_ranks_and_merged_view(run):
    mode, outs, body = run
    ranks = body["ranks"]
    assert all("error" not in r for r in ranks), ranks
    ids = sorted((r["status"]["rank"]["tp"], r["status"]["rank"]["dp"]) for r in ranks)
    if mode == "dp2":
        assert ids == [(0, 0), (0, 1)]
        assert len({r["status"]["pid"] for r in ranks}) == 2
        assert all(r["profile"]["totals"]["decode_steps"] > 0 for r in ranks)  # both DP groups served
    else:
        assert ids == [(0, 0)]  # TP rank 0 answers for the TP group
    merged, merged_ph = _totals(body["buckets"])
    per = [_totals(r["profile"]["buckets"]) for r in ranks]
    for k in ("steps", "req_steps", "committed"):
        assert merged[k] == sum(t[k] for t, _ in per), k
    for p in PHASES:
        assert merged_ph[p] == pytest.approx(sum(ph[p] for _, ph in per), rel=1e-9), p
    for b in body["buckets"]:
        for p in PHASES:
            assert b["phases"][p]["mean_ms"] > 0, (mode, b["label"], p)


def test_merged_view_reconciles_with_clients(run):
    mode, outs, body = run
    merged, _ = _totals(body["buckets"])
    assert merged["req_steps"] == sum(o["meta_info"]["spec_verify_ct"] for o in outs), mode
    assert merged["committed"] == sum(o["meta_info"]["completion_tokens"] - 1 for o in outs), mode
    assert body["dropped"] == 0 and body["algorithms"] == ["EAGLE"]
