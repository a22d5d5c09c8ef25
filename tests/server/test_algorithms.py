"""Every built-in speculative algorithm that SGLang runs on this CPU, on a real server.

One server per algorithm, one at a time (module-scoped parametrized fixture).  Each asserts the
phases ctxprof must name for that algorithm, that the leaf phases add up to the step span, and
that step counts reconcile with what SGLang reported to the client.

MTP: DeepSeek-V3 with its own NextN layer as the draft (``EAGLE`` + draft path = the model, what
launch/deepseek-v3-mtp.sh runs).  Stock SGLang 0.5.23 cannot start it on CPU
(``DeepseekV2ForCausalLM.set_embed_and_head`` calls ``torch.cuda.synchronize()``), so this case
path-loads the test plugin tests/plugins/cpu_no_cuda_sync.  ``--enable-multi-layer-eagle`` is not
run: SGLang supports it only for NextN classes that take ``draft_model_idx`` (MiMo-V2, Step3p5,
GigaChat3.5, Inkling); with DeepSeek-V3 it fails at load with ``TypeError: DeepseekV3ForCausalLMNextN
.__init__() got an unexpected keyword argument 'draft_model_idx'``.
"""

from __future__ import annotations

import pytest

from conftest import MODEL_CACHE, ROOT, generate, http, rand_ids, start_server, tiny, write_dist_info
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

CTX = (64, 1100)
ALL = ("draft", "verify", "verify_attn", "verify_rest", "draft_extend", "overhead")

# name -> (tiny model spec, algorithm, phases that must be > 0, phases that must be 0, min accept/step)
CASES = {
    "EAGLE": (("deepseek-v3", "eagle", True), "EAGLE", ALL + ("verify_moe",), ("unattributed",), 1.5),
    "EAGLE3": (("deepseek-v3", "eagle3", False), "EAGLE3", ALL + ("verify_moe",), ("unattributed",), 1.0),
    "STANDALONE": (("llama", "standalone", True), "STANDALONE", ALL, ("verify_moe", "unattributed"), 1.5),
    "NGRAM": (("qwen3-moe", None, False), "NGRAM", ALL + ("verify_moe",), ("unattributed",), 1.0),
    "MTP": (("deepseek-v3", "mtp", True), "EAGLE", ALL + ("verify_moe",), ("unattributed",), 1.5),
    # a random DFlash drafter accepts ~0 of its 3 draft positions: accepted = the bonus token
    "DFLASH": (("qwen3-moe", "dflash", False), "DFLASH", ALL + ("verify_moe",), ("unattributed",), 1.0),
}
FIX = ROOT / "tests" / "plugins" / "cpu_no_cuda_sync"
DFLASH_FIX = ROOT / "tests" / "plugins" / "cpu_dflash"


def _plugin_env(fix, module: str, tmp_dir) -> dict:
    write_dist_info(str(tmp_dir), module)
    return {"PYTHONPATH": f"{fix}:{tmp_dir}"}


def _mtp_env(tmp_dir) -> dict:
    return _plugin_env(FIX, "cpu_no_cuda_sync", tmp_dir)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request, tmp_path_factory):
    (arch, draft, ha), alg, *_ = CASES[request.param]
    env = None
    if draft == "mtp":
        from mtp_model import build_mtp

        base = tiny(arch, "eagle", high_acceptance=ha)["target"]
        target = build_mtp(base, str(MODEL_CACHE / "deepseek-v3-mtp-ha" / "target"))
        m = {"target": target, "draft": target}  # SGLang loads the NextN layer from the model itself
        env = _mtp_env(tmp_path_factory.mktemp("mtp-ep"))
    else:
        m = tiny(arch, draft, high_acceptance=ha)
    if draft == "dflash":  # SGLang refuses DFLASH on a CPU device: see tests/plugins/cpu_dflash
        env = _plugin_env(DFLASH_FIX, "cpu_dflash", tmp_path_factory.mktemp("dflash-ep"))
    args = cpu_args(m["target"], algorithm=alg, draft=m.get("draft"))
    if request.param == "NGRAM":
        env = {**(env or {}), "SGLANG_CTX_PROFILE": "1"}  # the env switch, instead of the flag
    else:
        args += ["--enable-ctx-profile"]
    srv = start_server(f"alg-{request.param.lower()}", args, env=env)
    try:
        outs = [generate(srv.url, rand_ids(n, seed=7 + n), max_new_tokens=24) for n in CTX]
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200, body
        if request.param == "DFLASH":
            rid = outs[0]["meta_info"]["id"]
            status, one = http("GET", srv.url + f"/ctx_profile/requests/{rid}")
            assert status == 200, one
            body = {**body, "_request": one}
        yield request.param, outs, body
    finally:
        srv.stop()


def test_expected_phases(run):
    name, _, body = run
    _, alg, positive, zero, min_accept = CASES[name]
    assert body["algorithms"] == [alg]
    assert len(body["buckets"]) == len(CTX), [b["label"] for b in body["buckets"]]
    for b in body["buckets"]:
        ph = b["phases"]
        for p in positive:
            assert ph[p]["mean_ms"] > 0, (name, b["label"], p)
        for p in zero:
            assert ph.get(p, {}).get("mean_ms", 0) == 0, (name, b["label"], p)
        assert b["accepted_per_step"] >= min_accept, (name, b["label"], b["accepted_per_step"])
    if name == "DFLASH":
        _block_drafter_rows(run[1], body)


def test_leaves_add_up_and_steps_reconcile(run):
    name, outs, body = run
    for b in body["buckets"]:
        ph = b["phases"]
        leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
        assert leaves == pytest.approx(ph["step"]["total_ms"], rel=1e-6, abs=1e-6), name
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert sum(b["req_steps"] for b in body["buckets"]) == steps, name
    # every generated token after the first (which comes from prefill) is counted exactly once
    committed = sum(b["committed"] for b in body["buckets"])
    assert committed == sum(o["meta_info"]["completion_tokens"] - 1 for o in outs), name


def _block_drafter_rows(outs, body):
    """DFLASH: each decode step of a request proposes one block of 4 (anchor + 3 drafts) in one
    denoising pass of the drafter."""
    rows = body["_request"]["step_rows"]
    assert len(rows) == outs[0]["meta_info"]["spec_verify_ct"]
    for row in rows:
        assert row["draft_tokens"] == 4 and row["block_size"] == 4 and row["denoise_steps"] == 1, row
        assert 1 <= row["accepted"] <= 4 and row["committed"] <= row["accepted"], row
        for p in ("draft", "verify", "draft_extend", "overhead"):
            assert row["phases_ms"][p] > 0, (p, row)
