"""A custom speculative algorithm from a user plugin (tests/plugins/toy_ddtree) on a real CPU server.

``TOY_DDTREE`` is registered with ``SpeculativeAlgorithm.register`` by a plugin that is path-loaded
(PYTHONPATH + a dist-info entry point written into a temp folder; nothing is installed).  Its worker
has its own class names and its own draft / draft-extend methods, so ctxprof cannot name them:

* "generic": ctxprof still reports the step span, context buckets, acceptance and verify (with its
  attention / MoE split) through the generic step and verify hooks; the rest of the step is
  ``unattributed`` and no draft phase is invented;
* "declared": the worker declares ``sglang_ctxprof.phase("draft")`` / ``phase("draft_extend")``
  and gets full phase records.

One server per mode, one at a time (a module-scoped parametrized fixture).
"""

from __future__ import annotations

import pytest

from conftest import ROOT, generate, http, rand_ids, start_server, tiny, write_dist_info
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

PLUGIN_DIR = ROOT / "tests" / "plugins" / "toy_ddtree"
CTX = (64, 1200)


@pytest.fixture(scope="module", params=["generic", "declared"])
def run(request, tmp_path_factory):
    import sys

    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        import toy_ddtree
    finally:
        sys.path.remove(str(PLUGIN_DIR))
    ep_dir = tmp_path_factory.mktemp("toy-ep")
    write_dist_info(str(ep_dir), toy_ddtree.__name__)
    m = tiny("qwen3-moe", "standalone", high_acceptance=True)  # MoE target: verify_moe is measurable
    args = cpu_args(m["target"], algorithm=toy_ddtree.NAME, draft=m["draft"], topk=2,
                    num_draft_tokens=6) + ["--enable-ctx-profile"]
    # SGLang turns the overlap scheduler off on CPU for its own algorithms only; a custom one must ask.
    args += ["--disable-overlap-schedule"]
    env = {"PYTHONPATH": f"{PLUGIN_DIR}:{ep_dir}"}
    if request.param == "declared":
        env[toy_ddtree.DECLARE_ENV] = "1"
    srv = start_server(f"custom-toy-ddtree-{request.param}", args, env=env)
    try:
        outs = [generate(srv.url, rand_ids(n, seed=n), max_new_tokens=24) for n in CTX]
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200, body
        st = http("GET", srv.url + "/ctx_profile/status")[1]
        yield request.param, outs, body, st
    finally:
        srv.stop()


def test_generic_hooks_still_report(run):
    mode, outs, body, _ = run
    assert body["algorithms"] == ["TOY_DDTREE"]
    labels = {b["label"] for b in body["buckets"]}
    assert {"64-127", "1024-2047"} <= labels, labels
    for b in body["buckets"]:
        ph = b["phases"]
        for p in ("step", "verify", "verify_attn", "verify_moe", "verify_rest"):
            assert ph[p]["mean_ms"] > 0, (mode, b["label"], p)
        assert b["accepted_per_step"] >= 1.0
        assert b["decode_tok_s"] > 0
        leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
        assert leaves == pytest.approx(ph["step"]["total_ms"], rel=1e-6, abs=1e-6)
    # exact accounting against what SGLang told the client
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert sum(b["req_steps"] for b in body["buckets"]) == steps


def test_unnamed_time_is_unattributed_not_guessed(run):
    mode, _, body, st = run
    for b in body["buckets"]:
        ph = b["phases"]
        assert ph["unattributed"]["mean_ms"] > 0, (mode, b["label"])
        assert ph.get("overhead", {}).get("mean_ms", 0) == 0  # "overhead" only for known algorithms
        if mode == "generic":
            # the toy's own draft code is invisible to ctxprof: no draft time is invented
            assert ph.get("draft", {}).get("mean_ms", 0) == 0, b["label"]
            assert ph.get("draft_extend", {}).get("mean_ms", 0) == 0, b["label"]
    ranks = st["ranks"]
    assert ranks and all(r["status"]["algorithm"] == "TOY_DDTREE" for r in ranks), ranks


def test_declared_phases_give_full_records(run):
    """Declared: draft and draft_extend are timed beside verify; generic: exactly those two are not."""
    mode, _, body, _ = run
    declared = {"draft", "draft_extend"}
    for b in body["buckets"]:
        ph = b["phases"]
        for p in ("verify", "verify_attn", "verify_moe"):
            assert ph[p]["mean_ms"] > 0, (mode, b["label"], p)
        timed = {p for p in declared if ph.get(p, {}).get("mean_ms", 0) > 0}
        assert timed == (declared if mode == "declared" else set()), (mode, b["label"], timed)
