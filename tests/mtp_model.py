"""A tiny DeepSeek-V3 with one MTP (NextN) layer, for the MTP tests: ``build_mtp(target_dir, out)``.

Starts from the pure-bigram tiny DeepSeek-V3 (``tiny("deepseek-v3", "eagle", high_acceptance=True)``
target) and appends ``model.layers.{N}``: a copy of the last decoder layer (its attention and MoE
outputs are zero, so they run at full cost and add nothing) plus the NextN parts ``eh_proj = [I|0]``,
``enorm = 1``, ``hnorm = 1`` and ``shared_head.norm = model.norm``.  The MTP head then predicts
exactly what the bigram target predicts, so acceptance is realistic (not ~1).
"""

from __future__ import annotations

import json
import os
import shutil


def build_mtp(target_dir: str, out: str) -> str:
    import torch
    from safetensors.torch import load_file, save_file

    stamp = os.path.join(out, ".ctxprof-mtp-stamp")
    if os.path.exists(stamp):
        return out
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(target_dir, out)
    cfg_path = os.path.join(out, "config.json")
    cfg = json.load(open(cfg_path))
    n, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    cfg["num_nextn_predict_layers"] = 1
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    path = os.path.join(out, "model.safetensors")
    w = load_file(path)
    src, dst = f"model.layers.{n - 1}.", f"model.layers.{n}."
    for k in [k for k in w if k.startswith(src)]:
        w[dst + k[len(src):]] = w[k].clone()
    dtype = w["model.norm.weight"].dtype
    eh = torch.zeros(hidden, 2 * hidden, dtype=dtype)
    eh[:, :hidden] = torch.eye(hidden, dtype=dtype)
    w[dst + "eh_proj.weight"] = eh
    w[dst + "enorm.weight"] = torch.ones(hidden, dtype=dtype)
    w[dst + "hnorm.weight"] = torch.ones(hidden, dtype=dtype)
    w[dst + "shared_head.norm.weight"] = w["model.norm.weight"].clone()
    save_file(w, path, metadata={"format": "pt"})
    open(stamp, "w").close()
    return out
