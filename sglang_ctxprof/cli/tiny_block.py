"""Tiny random block drafters for ``sglang-ctxprof tiny-model --draft dflash`` (no download).

A DFlash drafter (SGLang ``models/dflash.py``, ``DFlashDraftModel``) is a small Qwen3-style decoder
stack that denoises a block ``[anchor, mask, mask, ...]`` in one pass, conditioned on hidden states
the target captures at ``dflash_config.target_layer_ids``: ``fc`` projects their concatenation
(K * hidden) to hidden, ``hidden_norm`` normalizes it, ``norm`` closes the stack, and the target's
embedding and lm_head are shared (the drafter has none of its own).  The checkpoint written here has
exactly those tensors, random bf16 weights (fixed seed), the target's hidden size and vocabulary,
and ``block_size`` = 4 with the tokenizer's pad token as the mask token.
"""

from __future__ import annotations

import json
import os

BLOCK_SIZE = 4
TARGET_LAYER_IDS = (1, 2)
MASK_TOKEN, MASK_TOKEN_ID = "<|pad|>", 2  # build_tokenizer's special tokens: bos, eos, pad, ...


def save_dflash(name: str, target_cfg, out: str, layers: int = 1, seed: int = 11,
                log=print) -> str:
    """Write a DFlash drafter for ``target_cfg`` (an HF config with hidden_size and vocab_size);
    returns its folder (the caller puts the tokenizer beside it)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    H = int(target_cfg.hidden_size)
    heads = int(getattr(target_cfg, "num_attention_heads", 4))
    cfg = Qwen3Config(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=H // heads,
                      vocab_size=int(target_cfg.vocab_size), max_position_embeddings=8192,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(seed)
    m = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    sd = {k[len("model."):]: v.contiguous() for k, v in m.state_dict().items()
          if k.startswith("model.layers.") or k == "model.norm.weight"}
    g = torch.Generator().manual_seed(seed)
    sd["fc.weight"] = (torch.randn(H, len(TARGET_LAYER_IDS) * H, generator=g) * 0.02).to(torch.bfloat16)
    sd["hidden_norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c.update(architectures=["DFlashDraftModel"], torch_dtype="bfloat16", block_size=BLOCK_SIZE,
             num_target_layers=int(target_cfg.num_hidden_layers),
             dflash_config={"block_size": BLOCK_SIZE, "target_layer_ids": list(TARGET_LAYER_IDS),
                            "mask_token": MASK_TOKEN, "mask_token_id": MASK_TOKEN_ID})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    log(f"{name}: DFlash drafter block_size={BLOCK_SIZE} layers={layers} tensors={len(sd)} -> {d}")
    return d
