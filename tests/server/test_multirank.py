"""Multi-rank SGLang on the CPU (gloo): ``--dp-size 2`` and ``--tp-size 2``.

* dp2: two scheduler processes, each answering /ctx_profile for its DP group.  The response lists
  both ranks (dp 0 and dp 1, each with its own requests) and a merged view whose counts and phase
  totals are exactly the sums of the ranks', and which reconciles with what SGLang told clients.
* tp2: two TP ranks run every step together; SGLang's control channel is answered by TP rank 0
  only, so /ctx_profile shows one rank (tp 0) speaking for the TP group.
* Either way a deep capture (``POST /ctx_profile/capture?steps=3``) runs on every rank: with tp2 both
  TP ranks start SGLang's profiler at the same step and stop it together at SGLang's stop barrier
  (the TP group's), each writing its own trace; with dp2 each DP group captures its own steps.

What this machine needs (SGLang 0.5.23, 1 NUMA node, no CUDA): ``SGLANG_CPU_OMP_THREADS_BIND`` (one
core per rank), and for tp2 the test-only plugin tests/plugins/cpu_tp_gloo (SGLang creates PyNccl
groups on CPU otherwise: "Expected a cuda device, but got: cpu").
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, generate, http, rand_ids, start_server, tiny, write_dist_info
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.model import names

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
    captures = tmp_path_factory.mktemp(f"captures-{request.param}")
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", names.ENV_CAPTURE_DIR: str(captures)}
    if request.param == "tp2":
        env.update(_gloo_env(tmp_path_factory.mktemp("gloo-ep")))
    srv = start_server(f"multirank-{request.param}", args, env=env)
    try:
        jobs = [(64, 20), (900, 24), (200, 16), (1500, 12)]
        with cf.ThreadPoolExecutor(2) as ex:
            outs = list(ex.map(lambda j: generate(srv.url, rand_ids(j[0], seed=j[0]), max_new_tokens=j[1]), jobs))
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200, body
        body["_capture"] = _capture(srv.url, captures)
        yield request.param, outs, body
    finally:
        srv.stop()


def _capture(url: str, captures: Path) -> dict:
    """A manual capture of 3 steps while a request decodes: what every rank that answers says of it
    once it is done, and the trace files written."""
    status, out = http("POST", url + names.ROUTE_CAPTURE + "?steps=3", {})
    assert status == 200, out
    cid = out["captures"][0]["id"]
    # two requests: SGLang's round robin gives each DP group one (a group that runs no batch never
    # ticks, so its capture would wait for its next step)
    gens = [threading.Thread(target=generate, args=(url, rand_ids(100, seed=5 + k), 24), daemon=True)
            for k in range(2)]
    for gen in gens:
        gen.start()
    done = (names.CAPTURE_DONE, names.CAPTURE_FAILED, names.CAPTURE_DELETED)
    t0, infos = time.time(), []
    while time.time() - t0 < 240:
        ranks = http("GET", url + names.ROUTE_STATUS)[1]["ranks"]
        infos = [next((c for c in r["status"]["capture"]["captures"] if c["id"] == cid), None) for r in ranks]
        if all(c is not None and c["state"] in done for c in infos):
            break
        time.sleep(0.5)
    for gen in gens:
        gen.join(120)
    return {"infos": infos, "files": sorted(p.name for p in captures.rglob("*.trace.json*"))}


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


def test_a_deep_capture_runs_on_every_rank_and_stops_on_all_together(run):
    """tp2: both TP ranks capture the same 3 steps and meet at SGLang's stop barrier (a rank that
    stopped at another step would wait there for ever: the capture would never be done); each TP
    rank writes its trace.  dp2: each DP group captures 3 of its own steps."""
    mode, _, body = run
    cap = body["_capture"]
    assert cap["infos"] and all(c and c["state"] == names.CAPTURE_DONE and len(c["step_ids"]) == 3
                                for c in cap["infos"]), cap
    if mode == "tp2":
        assert len(cap["infos"]) == 1 and [f for f in cap["files"] if "TP-0" in f] \
            and [f for f in cap["files"] if "TP-1" in f], cap["files"]
    else:
        assert len(cap["infos"]) == 2 and len(cap["files"]) >= 2, cap["files"]
