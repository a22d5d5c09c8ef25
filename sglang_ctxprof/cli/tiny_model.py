"""Tiny random-weight models with no download: ``sglang-ctxprof tiny-model``.

Writes an HF-format target (config, seeded random bf16 safetensors, a byte-level BPE tokenizer
trained locally on CPython's stdlib sources) and, with ``--draft``, a matching draft:

* ``--arch``: ``llama``, ``qwen3-moe`` or ``deepseek-v3`` (MLA + MoE, the Kimi-K2 architecture);
* ``--draft eagle``: an EAGLE-1 head; ``eagle3``: an EAGLE-3 head; ``standalone``: a 1-layer Llama;
  ``dflash``: a DFlash block-diffusion drafter (``tiny_block``);
* ``--high-acceptance``: random models accept ~1 token per step with any learned draft, so this
  makes the target "pure bigram" (attention/MLP/MoE outputs zeroed - they still run at full cost)
  and, with ``--draft eagle``, an "identity" EAGLE head that reproduces it: ~3.7 of 4 accepted.

Output is deterministic (fixed seeds) and cached: a second call with the same arguments reuses it.
Layout: ``OUT/target``, ``OUT/draft-<kind>``, ``OUT/_tokenizer``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass

VOCAB = 4096
MAXPOS = 8192

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:120]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MAXPOS
    fast.save_pretrained(out_dir)
    return fast


COMMON = dict(
    vocab_size=VOCAB,
    max_position_embeddings=MAXPOS,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    torch_dtype="bfloat16",
)


# sglang's CPU rope factory (get_rope_cpu) only supports MLA models with a
# deepseek_yarn rope, as in the real DeepSeek-V3 / Kimi-K2 configs.
YARN = dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096,
                             "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "rope_theta": 10000.0})


def cfg_llama(hidden=256, layers=4, heads=4, kv=2, inter=512):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads, **COMMON)


def cfg_qwen3(hidden=256, layers=4, heads=4, kv=2, inter=512):
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads,
                       **COMMON)


def cfg_qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], **COMMON)


def cfg_qwen2_moe():
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                          shared_expert_intermediate_size=256,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                          decoder_sparse_step=1, mlp_only_layers=[], **COMMON)


def _deepseek(config_cls, **kw):
    """A 4-layer MLA + MoE config (DeepSeek V2/V3 share every size; ``kw`` is what differs)."""
    return config_cls(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                      n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
                      kv_lora_rank=64, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32,
                      n_group=1, topk_group=1, first_k_dense_replace=1, moe_layer_freq=1,
                      **kw, **{**COMMON, **YARN})


def cfg_deepseek_v3(q_lora_rank=None):
    from transformers import DeepseekV3Config

    return _deepseek(DeepseekV3Config, routed_scaling_factor=2.5, q_lora_rank=q_lora_rank,
                     norm_topk_prob=True, topk_method="noaux_tc", scoring_func="sigmoid")


def cfg_deepseek_v2():
    from transformers import DeepseekV2Config

    return _deepseek(DeepseekV2Config, routed_scaling_factor=1.0, q_lora_rank=None,
                     norm_topk_prob=False, topk_method="greedy", scoring_func="softmax")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def copy_tokenizer(tok_dir: str, d: str) -> None:
    """Put the tiny tokenizer's files beside a model's weights (SGLang loads them from there)."""
    for f in TOKENIZER_FILES:
        p = os.path.join(tok_dir, f)
        if os.path.exists(p):
            shutil.copy(p, d)


def save_hf(name, cfg, out, tok_dir, seed=0):
    import torch

    from transformers import AutoModelForCausalLM

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    copy_tokenizer(tok_dir, d)
    n = sum(p.numel() for p in model.parameters())
    _log(f"{name}: {type(model).__name__} params={n/1e6:.2f}M -> {d}")
    return d


def save_eagle(name, target_cfg_fn, out, tok_dir, seed=1):
    """EAGLE(-1/2) draft head for a Llama target: 1 decoder layer + fc(2H->H).

    sglang LlamaForCausalLMEagle.load_weights() prepends 'model.' so the file
    holds unprefixed names; layer 0 has no input_layernorm, no final norm.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    cfg = target_cfg_fn(layers=1)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    sd = {}
    for k, v in m.state_dict().items():
        if k.startswith("lm_head") or k == "model.norm.weight" or k.endswith("layers.0.input_layernorm.weight"):
            continue
        sd[k[len("model."):]] = v.contiguous()
    H = cfg.hidden_size
    sd["fc.weight"] = (torch.randn(H, 2 * H) * 0.02).to(torch.bfloat16)
    sd["fc.bias"] = torch.zeros(H, dtype=torch.bfloat16)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = ["LlamaForCausalLMEagle"]
    c["torch_dtype"] = "bfloat16"
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    copy_tokenizer(tok_dir, d)
    _log(f"{name}: EAGLE head tensors={len(sd)} -> {d}")
    return d


def save_eagle3(name, out, tok_dir, H=256, heads=4, kv=2, inter=512, seed=3):
    import torch

    """EAGLE-3 draft head (sglang LlamaForCausalLMEagle3): 1 'midlayer' whose qkv take
    [embeds ; hidden] (2H), fc over 3 captured target hidden states (3H->H), final norm,
    own lm_head (draft vocab == target vocab here, d2t = zeros i.e. identity map).
    """
    from safetensors.torch import save_file

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    hd = H // heads

    def w(o, i):
        return (torch.randn(o, i, generator=g) * 0.02).to(torch.bfloat16)

    sd = {
        "midlayer.self_attn.q_proj.weight": w(heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(kv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, heads * hd),
        "midlayer.mlp.gate_proj.weight": w(inter, H),
        "midlayer.mlp.up_proj.weight": w(inter, H),
        "midlayer.mlp.down_proj.weight": w(H, inter),
        "midlayer.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "fc.weight": w(H, 3 * H),
        "norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "lm_head.weight": w(VOCAB, H),
        "d2t": torch.zeros(VOCAB, dtype=torch.int64),
        "t2d": torch.ones(VOCAB, dtype=torch.bool),
    }
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": H, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": MAXPOS, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "vocab_size": VOCAB, "draft_vocab_size": VOCAB,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "torch_dtype": "bfloat16",
        # sglang's default capture ids for a 4-layer target are [2, 2, 1] -> only 2 distinct
        # aux states; name 3 distinct target layers explicitly.
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    }
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    copy_tokenizer(tok_dir, d)
    _log(f"{name}: EAGLE3 head tensors={len(sd)} -> {d}")


def save_bigram(name, src, out, zero_mlp=False):
    """Copy of a model with every attention output projection zeroed.

    Its next-token prediction then depends only on the current token, so a draft
    that sees a slightly different context (sglang's EAGLE/STANDALONE draft runs on
    the prompt shifted by one token) still agrees with the target: acceptance ~100%.
    Random full-attention models are so context-sensitive that dropping the first of
    1024 prompt tokens flips the argmax.
    """
    import torch
    from safetensors.torch import load_file, save_file

    s = os.path.join(out, src)
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(s, d)
    sd = load_file(os.path.join(s, "model.safetensors"))
    n = 0
    for k in sd:
        if k.endswith("self_attn.o_proj.weight") or (zero_mlp and k.endswith("down_proj.weight")):
            sd[k] = torch.zeros_like(sd[k])
            n += 1
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    _log(f"{name}: zeroed {n} o_proj{'/down_proj' if zero_mlp else ''} -> {d}")


def save_eagle_identity(name, out, tok_dir, H=256):
    """EAGLE-1 head that reproduces a *pure-bigram* target (o_proj and down_proj zeroed, so the
    target's final hidden state is its input embedding): fc = [I | 0] passes the next token's
    embedding through, the head's o_proj/down_proj are zero, and sglang shares the target's
    lm_head -> argmax(lm_head(e)) == argmax(lm_head(rmsnorm(e))). Acceptance ~100%.
    Attention/MLP/MoE still execute (with zero outputs), so timings stay realistic.
    """
    import torch
    from safetensors.torch import load_file, save_file

    save_eagle(name, cfg_llama, out, tok_dir, seed=5)

    f = os.path.join(out, name, "model.safetensors")
    sd = load_file(f)
    sd["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1).to(torch.bfloat16)
    sd["fc.bias"] = torch.zeros(H, dtype=torch.bfloat16)
    for k in list(sd):
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            sd[k] = torch.zeros_like(sd[k])
    save_file(sd, f, metadata={"format": "pt"})
    _log(f"{name}: identity EAGLE head -> {os.path.dirname(f)}")



def _log(msg: str) -> None:
    if os.environ.get("CTXPROF_QUIET") != "1":
        print(msg, flush=True)


ARCHS = {"llama": cfg_llama, "qwen3-moe": cfg_qwen3_moe, "deepseek-v3": cfg_deepseek_v3}
DRAFTS = ("eagle", "eagle3", "standalone", "dflash")


@dataclass
class TinyModelArgs:
    arch: str = "deepseek-v3"
    out: str = "models/tiny"
    draft: str | None = None
    high_acceptance: bool = False

    @staticmethod
    def add_cli_args(ap) -> None:
        ap.add_argument("--arch", choices=sorted(ARCHS), default="deepseek-v3")
        ap.add_argument("--out", required=True, help="output directory")
        ap.add_argument("--draft", choices=DRAFTS, default=None, help="also write a matching draft model")
        ap.add_argument("--high-acceptance", action="store_true",
                        help="pure-bigram target (+ identity EAGLE head): realistic acceptance (~3.7 of 4)")

    @classmethod
    def from_cli_args(cls, ns) -> "TinyModelArgs":
        if ns.high_acceptance and ns.draft in ("eagle3", "dflash"):
            raise ValueError("--high-acceptance supports --draft eagle or standalone "
                             "(no identity EAGLE-3 or DFlash drafter exists)")
        return cls(arch=ns.arch, out=ns.out, draft=ns.draft, high_acceptance=ns.high_acceptance)


def build(args: TinyModelArgs) -> dict[str, str]:
    """Build (or reuse) the models; return {"target": path, "draft": path?}."""
    out = os.path.abspath(args.out)
    stamp = json.dumps({"v": 1, **args.__dict__, "out": None}, sort_keys=True)
    stamp_path = os.path.join(out, ".ctxprof-stamp.json")
    paths = {"target": os.path.join(out, "target")}
    if args.draft:
        paths["draft"] = os.path.join(out, f"draft-{args.draft}")
    if os.path.exists(stamp_path) and open(stamp_path).read() == stamp and all(
            os.path.exists(os.path.join(p, "config.json")) for p in paths.values()):
        return paths
    os.makedirs(out, exist_ok=True)
    tok_dir = os.path.join(out, "_tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        build_tokenizer(tok_dir)
    work = os.path.join(out, "_work")
    os.makedirs(work, exist_ok=True)
    save_hf("raw", ARCHS[args.arch](), work, tok_dir)
    if args.high_acceptance:
        save_bigram("target", "raw", work, zero_mlp=True)
    else:
        shutil.rmtree(os.path.join(work, "target"), ignore_errors=True)
        shutil.copytree(os.path.join(work, "raw"), os.path.join(work, "target"))
    _replace(os.path.join(work, "target"), paths["target"])
    if args.draft == "eagle":
        if args.high_acceptance:
            save_eagle_identity("draft", work, tok_dir)
        else:
            save_eagle("draft", cfg_llama, work, tok_dir)
    elif args.draft == "eagle3":
        save_eagle3("draft", work, tok_dir)
    elif args.draft == "dflash":
        from .tiny_block import save_dflash

        copy_tokenizer(tok_dir, save_dflash("draft", ARCHS[args.arch](), work, log=_log))
    elif args.draft == "standalone":
        if args.high_acceptance:
            save_hf("sa", cfg_llama(), work, tok_dir)
            save_bigram("draft", "sa", work, zero_mlp=True)
        else:
            save_hf("draft", cfg_llama(hidden=128, layers=1, heads=2, kv=1, inter=256), work, tok_dir, seed=7)
    if args.draft:
        _replace(os.path.join(work, "draft"), paths["draft"])
    shutil.rmtree(work, ignore_errors=True)
    with open(stamp_path, "w") as f:
        f.write(stamp)
    return paths


def _replace(src: str, dst: str) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.move(src, dst)


def run(ns) -> int:
    args = TinyModelArgs.from_cli_args(ns)
    paths = build(args)
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0
