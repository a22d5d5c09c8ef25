"""Speculation against plain decode on real CPU servers: the ledger, planted causes, slow steps.

Two servers of the tiny DeepSeek-V3 (MLA + MoE): one with the identity EAGLE head and the test-only
``ctxprof_plant`` plugin, one plain (no speculation, same attention backend).  ``sweep --arms
spec,plain`` runs the same prompts on both, interleaved:

1. clean: the plain arm is profiled (decode attention / MoE / rest); the ledger's predicted speedup per
   context is within 10% of the measured spec/plain ratio (the long request's decode on the server's
   wall clock; the client's two-point figure carries the prefill's noise at long context);
2. a verify-only attention slowdown growing with context: verify inflation grows with context, the
   crossover moves to a shorter context and the ledger names the verify attention path;
3. a constant host delay per step: it shows as overhead (the ledger's overhead grows by the planted
   amount, inside net saved), verify inflation does not change.  Net saved itself is not compared
   across the two sweeps: on a shared CPU the plain arm's step moves more than the delay between runs;
4. ``diagnose --plain`` live; and a few planted slow steps are set apart without flipping the verdict.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import generate, http, rand_ids, start_server, tiny
from plant_rig import plant, start_planted
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.cli.sweep_arms import plain_args

# Opt-in (CTXPROF_ARMS_TESTS=1): two servers and three sweeps take ~10 minutes on 2 cores, and the
# clean run's 10% bound failed once in four runs on a busy machine; it joins `make test` once it is
# reliable and cheaper.
pytestmark = [pytest.mark.server,
              pytest.mark.skipif(os.environ.get("CTXPROF_ARMS_TESTS") != "1",
                                 reason="opt-in: CTXPROF_ARMS_TESTS=1 (two servers, ~10 min)")]

CTX = ("64", "1024", "3072")
SWEEP = ["--ctx", *CTX, "--repeat", "2", "--short", "4", "--long", "40", "--no-plots"]
RUNS: dict = {}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    spec_args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile"]
    spec = start_planted("arms-spec", spec_args, tmp_path_factory.mktemp("arms"))
    try:
        plain = start_server("arms-plain", plain_args(spec_args))
    except BaseException:
        spec.stop()
        raise
    try:
        yield spec, plain
    finally:
        spec.stop()
        plain.stop()


def arms(servers, name):
    spec, plain = servers
    out = spec.dir / name
    assert main(["sweep", "--url", spec.url, "--plain-url", plain.url, "--arms", "spec,plain",
                 "--out", str(out)] + SWEEP) == 0
    rep = json.loads((out / "arms.json").read_text())
    RUNS[name] = rep
    return rep, out


def _rows(rep):
    return {round(r["ctx"]): r for r in rep["ledger"]["rows"]}


def test_clean_arms_plain_profiled_and_the_ledger_predicts_the_measured_speedup(servers, capsys):
    rep, out = arms(servers, "clean")
    printed = capsys.readouterr().out
    assert "speculative vs plain decode" in printed and "speculation ledger" in printed
    for f in (out / "plain").glob("point-*.json"):
        ph = json.loads(f.read_text())["breakdown"]["phases_ms"]
        assert ph["decode_attn"] > 0 and ph["decode_moe"] > 0 and ph["decode_rest"] > 0 and "verify" not in ph
        assert ph["decode"] == pytest.approx(ph["decode_attn"] + ph["decode_moe"] + ph["decode_rest"], rel=1e-6)
    assert [t["ctx"] for t in rep["table"]] == [int(c) for c in CTX]
    for t in rep["table"]:
        s = t["server"]  # measured on the server's wall clock: the long request's decode steps
        assert s["repeats"] == 2 and s["spec_tok_s"] > 0 and s["plain_tok_s"] > 0
        assert t["predicted_speedup"] == pytest.approx(s["speedup"], rel=0.10), t
    led = rep["ledger"]
    assert led["available"] and all(r["plain_from"] == "measured" for r in led["rows"])
    assert all(r["verify_inflation"] > 0 and r["moe_inflation"] > 0 for r in led["rows"])
    assert rep["crossover"]["how"] in ("measured", "extrapolated", "none")


def test_planted_verify_attention_slowdown_is_named_and_moves_the_crossover(servers):
    spec, _ = servers
    plant(spec, attn_ms_per_1k=4.0)  # verify only: plain decode never runs a target-verify batch
    try:
        rep, _ = arms(servers, "verify_slow")
    finally:
        plant(spec)
    clean = RUNS["clean"]
    infl = [r["verify_inflation"] for r in rep["ledger"]["rows"]]
    assert infl == sorted(infl) and infl[-1] > 1.5 * infl[0]
    a = rep["ledger"]["attention"]
    assert a["scales_worse"] and "the verify attention path scales worse than decode attention" in a["verdict"]
    assert "the verify attention path scales worse" in rep["ledger"]["verdict"]
    before = clean["crossover"]["ctx"] if clean["crossover"].get("ctx") is not None else float("inf")
    assert rep["crossover"]["ctx"] is not None and rep["crossover"]["ctx"] < before
    # the plain arm did not move: its attention is the same as in the clean run within its own spread
    for ctx, r in _rows(rep).items():
        assert r["verify_attn_ms"] > _rows(clean)[ctx]["verify_attn_ms"]


def test_planted_host_delay_is_overhead_and_leaves_verify_inflation(servers):
    spec, _ = servers
    plant(spec, host_spin_ms=20.0)  # busy: a sleep would let other processes cool the core's caches
    try:
        rep, _ = arms(servers, "host_delay")
    finally:
        plant(spec)
    clean = _rows(RUNS["clean"])
    for ctx, r in _rows(rep).items():
        c = clean[ctx]
        grew = r["spent_ms"]["overhead_extra"] - c["spent_ms"]["overhead_extra"]
        assert grew == pytest.approx(20.0, rel=0.3), (ctx, grew)  # the planted delay is overhead
        # and net saved carries it: net = saved - spent, the delay inside spent's overhead
        assert r["net_ms"] == pytest.approx(r["saved_ms"] - sum(r["spent_ms"].values()), abs=1e-6)
        # none of it is charged to verify attention; inflation (two arms, two sweeps of a shared CPU:
        # each side moves by up to ~20% between runs) stays where it was
        assert abs(r["verify_attn_ms"] - c["verify_attn_ms"]) < 0.5 * 20.0, ctx
        assert r["verify_inflation"] == pytest.approx(c["verify_inflation"], rel=0.5), ctx


def test_diagnose_plain_live_and_planted_slow_steps_are_set_apart(servers, capsys):
    spec, plain = servers
    capsys.readouterr()
    assert main(["diagnose", "--url", spec.url, "--plain", plain.url]) == 0
    out = capsys.readouterr().out
    assert "speculation ledger (per spec step" in out and "  2048-4095  " in out  # the sweep's last point
    # a few slow steps (300 ms each, as a kernel compiling) in the short bucket
    assert http("POST", spec.url + "/ctx_profile/reset")[0] == 200
    plant(spec, stall_steps=3, stall_ms=300.0)
    try:
        generate(spec.url, rand_ids(80, seed=7), max_new_tokens=40)
    finally:
        plant(spec)
    generate(spec.url, rand_ids(3000, seed=8), max_new_tokens=40)
    status, d = http("GET", spec.url + "/ctx_profile/diagnosis")
    assert status == 200, d
    assert "decode is not slower" not in d["headline"] and "slower than at" in d["headline"], d["headline"]
    flag = [f for f in d["flags"] if f["kind"] == "outlier_steps"]
    assert flag and flag[0]["message"].startswith("bucket 64-127: 3 steps set apart"), d["flags"]
    assert "slow steps set apart" in d["headline"]
