"""Test-only SGLang plugin: make ``torch.cuda.synchronize()`` a no-op on a machine without CUDA.

SGLang 0.5.23 cannot start DeepSeek MTP (NextN) on CPU: ``DeepseekV2ForCausalLM.set_embed_and_head``
(models/deepseek_v2.py) calls ``torch.cuda.synchronize()`` unconditionally while the draft worker
shares the target's embedding and lm_head, and that raises "Found no NVIDIA driver".  On CPU
there is nothing to synchronize, so the MTP test loads this plugin (path-loaded, like toy_ddtree)
to get past it.  It changes nothing when CUDA is available.
"""

from __future__ import annotations



def register() -> None:
    import torch

    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None
