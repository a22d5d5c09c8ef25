"""A custom algorithm on SGLang's block drafter, from a user plugin, on a real CPU server.

``TOY_DDTREE_BLOCK`` (tests/plugins/toy_ddtree_block) is what a DDTree user's plugin looks like:
registered with ``SpeculativeAlgorithm.register``, its worker subclasses SGLang's ``DFlashWorkerV2``
and replaces the decode step with its own (its own proposal from the block, its own draft-KV
append), declaring ``sglang_ctxprof.phase("draft")`` / ``phase("draft_extend")``.  Both plugins
are path-loaded (PYTHONPATH + dist-info entry points written into a temp folder): this one and
tests/plugins/cpu_dflash, which lets DFLASH's drafter run on a CPU.  The tiny DFlash drafter and
MoE target are the DFLASH case's of test_algorithms.

ctxprof knows none of the worker's own methods: draft and draft_extend come only from the
declarations, verify (with its attention / MoE split) from the generic verify hook, and the rest of
the step (the acceptance decision) is ``unattributed``: no ``overhead``, and none of DFLASH's block
facts is claimed for a worker ctxprof does not know.
"""

from __future__ import annotations

import pytest

from conftest import ROOT, generate, http, rand_ids, start_server, tiny, write_dist_info
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

PLUGIN_DIR = ROOT / "tests" / "plugins" / "toy_ddtree_block"
DFLASH_FIX = ROOT / "tests" / "plugins" / "cpu_dflash"
CTX = (64, 1100)
LEAVES = ("draft", "verify", "draft_extend", "unattributed")
POSITIVE = ("step", "draft", "verify", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "unattributed")


def _import(folder, module: str):
    import importlib
    import sys

    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    toy = _import(PLUGIN_DIR, "toy_ddtree_block")
    ep_dir = tmp_path_factory.mktemp("toy-block-ep")
    write_dist_info(str(ep_dir), toy.__name__)
    write_dist_info(str(ep_dir), "cpu_dflash")
    m = tiny("qwen3-moe", "dflash")  # MoE target: verify_moe is measurable
    args = cpu_args(m["target"], algorithm=toy.NAME, draft=m["draft"]) + ["--enable-ctx-profile"]
    # SGLang turns the overlap scheduler off on CPU for its own algorithms only; a custom one must ask.
    args += ["--disable-overlap-schedule"]
    env = {"PYTHONPATH": f"{DFLASH_FIX}:{PLUGIN_DIR}:{ep_dir}", toy.DECLARE_ENV: "1"}
    srv = start_server("custom-toy-ddtree-block", args, env=env)
    try:
        outs = [generate(srv.url, rand_ids(n, seed=7 + n), max_new_tokens=24) for n in CTX]
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200, body
        reqs = []
        for o in outs:
            status, one = http("GET", srv.url + f"/ctx_profile/requests/{o['meta_info']['id']}")
            assert status == 200, one
            reqs.append(one)
        st = http("GET", srv.url + "/ctx_profile/status")[1]
        yield outs, body, reqs, st
    finally:
        srv.stop()


def test_declared_phases_and_verify_split(run):
    _, body, _, st = run
    assert body["algorithms"] == ["TOY_DDTREE_BLOCK"]
    assert len(body["buckets"]) == len(CTX), [b["label"] for b in body["buckets"]]
    for b in body["buckets"]:
        ph = b["phases"]
        for p in POSITIVE:
            assert ph[p]["mean_ms"] > 0, (b["label"], p)
        assert b["accepted_per_step"] >= 1.0
        leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
        assert leaves == pytest.approx(ph["step"]["total_ms"], rel=1e-6, abs=1e-6), b["label"]
    ranks = st["ranks"]
    assert ranks and all(r["status"]["algorithm"] == "TOY_DDTREE_BLOCK" for r in ranks), ranks


def test_unnamed_time_is_unattributed_and_nothing_invented(run):
    outs, body, reqs, _ = run
    for b in body["buckets"]:
        # "overhead" is for algorithms whose seams ctxprof knows; this worker's acceptance is not one
        assert b["phases"].get("overhead", {}).get("mean_ms", 0) == 0, b["label"]
    for out, one in zip(outs, reqs):
        rows = one["step_rows"]
        assert len(rows) == out["meta_info"]["spec_verify_ct"]
        for row in rows:
            assert set(row["phases_ms"]) <= set(LEAVES) | {"verify_attn", "verify_moe", "verify_rest"}, row
            for p in LEAVES:
                assert row["phases_ms"][p] > 0, (p, row)
            # DFLASH's block facts come from its own worker's hooks: not counted for this one
            assert row["denoise_steps"] == 0 and row["block_size"] == 0, row
            assert row["draft_tokens"] == 4 and 1 <= row["accepted"] <= 4, row


def test_steps_and_tokens_reconcile(run):
    outs, body, reqs, _ = run
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert sum(b["req_steps"] for b in body["buckets"]) == steps
    # every generated token after the first (which comes from prefill) is counted exactly once
    committed = sum(b["committed"] for b in body["buckets"])
    assert committed == sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    for out, one in zip(outs, reqs):
        assert 1 + sum(r["committed"] for r in one["step_rows"]) == out["meta_info"]["completion_tokens"]
