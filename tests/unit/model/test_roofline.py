"""Roofline arithmetic against hand-computed values (DeepSeek-V3, Llama-3 8B/70B) and its rendering."""

from __future__ import annotations

import pytest

from sglang_ctxprof.model import roofline as rl
from sglang_ctxprof.aggregate.aggregator import Aggregator, merge_states
from sglang_ctxprof.aggregate.snapshot import Snapshot
from sglang_ctxprof.views.profile import build_profile, summarize
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.roofline import hw_meta, kv_bytes_per_token

# DeepSeek-V3 (config.json): kv_lora_rank 512, qk_rope_head_dim 64, 61 layers, bf16 KV.
DSV3 = {"attention": "mla", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "layers": 61,
        "kv_dtype": "bfloat16", "kv_dtype_bytes": 2, "tp_size": 8}
# Llama-3-8B: 32 layers, 8 KV heads, head_dim 128.  Llama-3-70B: 80 layers, 8 KV heads, head_dim 128.
LLAMA8B = {"attention": "gqa", "num_kv_heads": 8, "head_dim": 128, "layers": 32, "kv_dtype_bytes": 2, "tp_size": 1}
LLAMA70B_TP8 = {"attention": "gqa", "num_kv_heads": 8, "head_dim": 128, "layers": 80, "kv_dtype_bytes": 2,
                "tp_size": 8}


def test_kv_bytes_per_token_by_hand():
    assert rl.kv_bytes_per_token(DSV3) == 576 * 2 * 61 == 70272  # latent replicated on each TP rank
    assert rl.kv_bytes_per_token(LLAMA8B) == 2 * 8 * 128 * 2 * 32 == 131072
    assert rl.kv_bytes_per_token(LLAMA70B_TP8) == 2 * 1 * 128 * 2 * 80 == 40960  # 1 KV head per rank
    fp8 = dict(LLAMA8B, kv_dtype_bytes=rl.dtype_bytes("fp8_e4m3"))
    assert rl.kv_bytes_per_token(fp8) == 65536
    # more TP ranks than KV heads: each rank still holds one head
    assert rl.kv_bytes_per_token(dict(LLAMA8B, tp_size=16)) == 2 * 1 * 128 * 2 * 32


def test_percent_by_hand():
    # DeepSeek-V3, batch of 8 x 4096 context = 32768 tokens: 70272 * 32768 = 2_302_672_896 bytes.
    nbytes = rl.kv_bytes_per_step(DSV3, 8 * 4096)
    assert nbytes == 2_302_672_896
    # read in 1.0 ms on an H200 (4800 GB/s): 2302.672896 GB/s achieved = 47.972352 %
    assert rl.percent_of_roofline(nbytes, 1.0, 4800.0) == pytest.approx(47.972352, rel=1e-9)
    # Llama-3-8B, 16 x 2048 = 32768 tokens: 131072 * 32768 = 4_294_967_296 bytes (4 GiB) in 2 ms
    # on an H100 SXM (3350 GB/s): 2147.483648 GB/s = 64.1040 %
    nb = rl.kv_bytes_per_step(LLAMA8B, 16 * 2048)
    assert nb == 4_294_967_296
    assert rl.percent_of_roofline(nb, 2.0, 3350.0) == pytest.approx(2147.483648 / 3350.0 * 100, rel=1e-12)


@pytest.mark.parametrize("name,gbps", [
    ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA H100 NVL", 3900.0),
    ("NVIDIA H200", 4800.0), ("NVIDIA B200", 8000.0),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 1792.0),
])
def test_bandwidth_table(name, gbps):
    assert rl.bandwidth_gbps(name)[0] == gbps


def test_bandwidth_override_cpu_and_errors():
    from sglang_ctxprof.model.config import CtxProfConfig

    def hbm(raw):
        return CtxProfConfig.from_env({"SGLANG_CTXPROF_HBM_GBPS": raw}).roofline.hbm_gbps

    assert rl.bandwidth_gbps("NVIDIA H200", hbm("4000")) == (4000.0, "override SGLANG_CTXPROF_HBM_GBPS")
    gbps, why = rl.bandwidth_gbps(None)
    assert gbps is None and "CPU" in why
    gbps, why = rl.bandwidth_gbps("NVIDIA A10G")
    assert gbps is None and "SGLANG_CTXPROF_HBM_GBPS" in why
    with pytest.raises(ValueError, match="SGLANG_CTXPROF_HBM_GBPS.*not a number"):
        hbm("fast")
    with pytest.raises(ValueError, match="> 0"):
        hbm("-1")
    with pytest.raises(ValueError, match="unknown KV dtype"):
        rl.dtype_bytes("int3")
    bad = rl.hw_meta({"attention": "gqa"}, "NVIDIA H200")
    assert bad["model"] is None and "incomplete" in bad["source"]


def _state(hw, attn_ms=1.0, ctx=(4096,) * 8):
    agg = Aggregator()
    for i in range(3):
        agg.observe(StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(),
                               rids=tuple(f"r{j}" for j in range(len(ctx))), ctx_lens=ctx,
                               accepted=(2,) * len(ctx), committed=(2,) * len(ctx),
                               finished=(False,) * len(ctx), draft_tokens=4, step_ms=5.0,
                               phases_ms={"verify": 3.0, "verify_attn": attn_ms, "verify_moe": 1.0,
                                          "verify_rest": 1.0, "draft": 1.0, "draft_extend": 0.5,
                                          "overhead": 0.5}, timing="cuda_events"))
    st = agg.state()
    st["meta"]["hw"] = hw
    return st


def test_summarize_renders_roofline_per_bucket():
    hw = rl.hw_meta(DSV3, "NVIDIA H200")
    body = summarize(merge_states([_state(hw), _state(None)]))  # the rank with facts wins the merge
    (b,) = body["buckets"]
    assert b["roofline"]["available"] is True
    # two ranks of 3 steps: per-step summed context stays 8 x 4096, attention mean 1 ms
    assert b["roofline"]["pct"] == pytest.approx(47.972352, rel=1e-9)
    assert b["roofline"]["kv_bytes_per_step"] == 2_302_672_896
    assert body["hw"]["hbm_gbps"] == 4800.0


def test_summarize_cpu_is_unavailable_with_reason():
    body = summarize(_state(rl.hw_meta(DSV3, None)))
    r = body["buckets"][0]["roofline"]
    assert r == {"available": False, "reason": "no GPU (CPU run): HBM roofline unavailable"}
    body = summarize(_state(None))
    assert body["buckets"][0]["roofline"]["available"] is False
    body = summarize(_state(rl.hw_meta(DSV3, "NVIDIA H200"), attn_ms=0.0))
    assert "no verify attention" in body["buckets"][0]["roofline"]["reason"]


ARCH = __import__("enum").IntEnum("AttentionArch", "MLA MHA SSM")  # same shape as SGLang's (str() is "1")


def _sched(arch, **cfg):
    from types import SimpleNamespace as NS

    arch = ARCH[arch.split(".")[-1]]
    hf = NS(num_key_value_heads=cfg.pop("kv", None), num_attention_heads=cfg.pop("heads", None))
    mc = NS(attention_arch=arch, num_attention_layers=cfg.pop("layers"), dtype="torch.bfloat16",
            hf_text_config=hf, **cfg)
    return NS(model_config=mc, tp_size=cfg.get("tp", 1), server_args=NS(kv_cache_dtype="auto", device="cpu"))


def test_adapter_model_facts_from_sglang_model_config():
    from sglang_ctxprof.collect import adapter
    
    mla = adapter.model_facts(_sched("AttentionArch.MLA", layers=61, kv_lora_rank=512, qk_rope_head_dim=64))
    assert mla["attention"] == "mla" and mla["kv_dtype_bytes"] == 2
    assert rl.kv_bytes_per_token(mla) == 70272
    gqa = adapter.model_facts(_sched("AttentionArch.MHA", layers=32, kv=8, heads=32, head_dim=128))
    assert gqa["attention"] == "gqa" and rl.kv_bytes_per_token(gqa) == 131072
    fp8 = _sched("AttentionArch.MHA", layers=32, kv=8, heads=32, head_dim=128)
    fp8.server_args.kv_cache_dtype = "fp8_e4m3"
    assert rl.kv_bytes_per_token(adapter.model_facts(fp8)) == 65536
    assert adapter.model_facts(object()) is None  # no model config: roofline unavailable, no crash
    assert adapter.device_name(fp8) is None  # a CPU run has no GPU name


def test_text_view_shows_roofline_or_why_not():
    from sglang_ctxprof.views.text import render

    gpu = render(build_profile(Snapshot.from_dict(_state(rl.hw_meta(DSV3, "NVIDIA H200")))))
    assert "attn %HBM" in gpu and "48.0" in gpu
    cpu = render(build_profile(Snapshot.from_dict(_state(rl.hw_meta(DSV3, None)))))
    assert "attn %HBM" not in cpu and "unavailable (no GPU (CPU run)" in cpu


def test_profiler_ships_hw_facts_in_its_state(monkeypatch):
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.collect.profiler import Profiler

    monkeypatch.setenv("SGLANG_CTXPROF_HBM_GBPS", "1000")  # even with an override, a CPU has model facts
    p = Profiler(CtxProfConfig.from_env())
    sched = _sched("AttentionArch.MLA", layers=61, kv_lora_rank=512, qk_rope_head_dim=64)
    sched.server_args.speculative_algorithm = "EAGLE"
    try:
        p.bind(sched)
        hw = p.state()["state"]["meta"]["hw"]
    finally:
        p.recorder.stop()
    assert hw["device"] == "cpu" and hw["kv_bytes_per_token"] == 70272 and hw["hbm_gbps"] == 1000.0
    st = _state(hw, attn_ms=1.0)
    assert summarize(st)["buckets"][0]["roofline"]["pct"] == pytest.approx(2_302_672_896 / 1e-3 / 1e12 * 100)


# ---- found by the CUDA-path read: bytes and time from the same steps, attention TP, sparse models
def _gpu_rec(step_id, ctx, attn_ms=None):
    phases = {"verify": 10.0, "overhead": 1.0}
    if attn_ms is not None:
        phases.update(verify_attn=attn_ms, verify_moe=0.0, verify_rest=10.0 - attn_ms)
    return StepRecord(step_id=step_id, kind="decode", algorithm="EAGLE", rank=RankId(0, 0, 0), rids=("a",),
                      ctx_lens=(ctx,), accepted=(1,), committed=(2,), finished=(False,), draft_tokens=4,
                      step_ms=11.0, phases_ms=phases, t_start_ns=0, timing="cuda_graph")


def test_roofline_bytes_and_time_come_from_the_same_steps():
    facts = {"layers": 1, "kv_dtype_bytes": 2, "attention": "gqa", "num_kv_heads": 1, "head_dim": 64,
             "tp_size": 1}
    hw = hw_meta(facts, "NVIDIA H200")
    agg = Aggregator()
    # one bucket: the sampled step (with an attention time) has 1000 tokens, the others 1023
    agg.observe(_gpu_rec(64, 1000, attn_ms=1.0))
    for i in range(1, 8):
        agg.observe(_gpu_rec(64 + i, 1023))
    b = build_profile(agg.snapshot().with_hw(hw)).buckets[0]
    assert b.roofline["kv_bytes_per_step"] == pytest.approx(1000 * kv_bytes_per_token(facts))


def test_roofline_uses_the_attention_tp_size_under_attention_dp():
    gqa = {"layers": 2, "kv_dtype_bytes": 2, "attention": "gqa", "num_kv_heads": 8, "head_dim": 128}
    assert kv_bytes_per_token({**gqa, "tp_size": 8, "attn_tp_size": 2}) == 2 * 4 * 128 * 2 * 2
    assert kv_bytes_per_token({**gqa, "tp_size": 8}) == 2 * 1 * 128 * 2 * 2


def test_roofline_is_unavailable_for_sparse_attention():
    facts = {"layers": 1, "kv_dtype_bytes": 2, "attention": "mla", "kv_lora_rank": 512, "qk_rope_head_dim": 64,
             "tp_size": 1, "sparse": "sparse attention (DSA/NSA, index_topk=2048)"}
    agg = Aggregator()
    agg.observe(_gpu_rec(64, 1000, attn_ms=1.0))
    r = build_profile(agg.snapshot().with_hw(hw_meta(facts, "NVIDIA H200"))).buckets[0].roofline
    assert r["available"] is False and "DSA" in r["reason"]
