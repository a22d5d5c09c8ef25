"""SGLang plugin: CPU-only workarounds so a stock sglang wheel (0.5.13-0.5.23) serves on a CPU host.

Part of sglang-ctxprof's patches/: it exists because PyPI's sgl-kernel is CUDA-only, which no hook
of the profiler can fix.  Install it only for CPU runs (tests, demo); a GPU deployment never needs it.
It acts only when SGLANG_USE_CPU_ENGINE=1.  The top-level ``common_ops`` module provides pure-PyTorch
versions of the sgl_kernel CPU ops sglang calls (see ../shared/reference/cpu/REPORT.md section 4).

Loaded by sglang.srt.plugins.load_plugins() in every sglang process (launcher, scheduler, detokenizer).
Only acts when SGLANG_USE_CPU_ENGINE=1.
"""
import logging
import os
import sys

logger = logging.getLogger("sglang_cpu_compat")


def _fused_gate_sigmoid_mul_torch(hidden_states, gate_weight, shared_output, output, *, do_add):
    # torch port of sglang.kernels.ops.elementwise.elementwise._fused_gate_sigmoid_mul_add_kernel
    import torch

    gate = torch.sigmoid((hidden_states.float() * gate_weight.float()).sum(-1, keepdim=True))
    res = gate * shared_output.float()
    if do_add:
        res = res + output.float()
    output.copy_(res.to(output.dtype))


# Where each release keeps the Triton shared-expert gate (0.5.14-0.5.18 import the public function by
# name into models/qwen2_moe.py; 0.5.19+ launch it through the private _launch_fused_gate_sigmoid_mul).
_GATE_MODULES = ("sglang.kernels.ops.elementwise.elementwise", "sglang.kernels.ops.layernorm.elementwise",
                 "sglang.srt.layers.elementwise")


def _fused_gate_sigmoid_mul_add_torch(hidden_states, gate_weight, shared_output, final_hidden_states):
    _fused_gate_sigmoid_mul_torch(hidden_states, gate_weight, shared_output, final_hidden_states, do_add=True)


def _patch_qwen2_moe_shared_gate():
    # Qwen2-MoE shared-expert gate uses a Triton kernel whenever the layer is not on the
    # intel_amx backend (qwen2_moe.py: use_fused_gate = ... not use_intel_amx_backend(...)).
    # Triton has no CPU driver -> "0 active drivers". Replace the launcher with torch ops.
    import importlib

    for name in _GATE_MODULES:
        try:
            ew = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(ew, "_launch_fused_gate_sigmoid_mul"):
            ew._launch_fused_gate_sigmoid_mul = _fused_gate_sigmoid_mul_torch
            return
        if hasattr(ew, "fused_gate_sigmoid_mul_add"):
            # the model imports it by name: patch the source before the model module is imported,
            # and the model module too if it already is
            ew.fused_gate_sigmoid_mul_add = _fused_gate_sigmoid_mul_add_torch
            model = sys.modules.get("sglang.srt.models.qwen2_moe")
            if model is not None and hasattr(model, "fused_gate_sigmoid_mul_add"):
                model.fused_gate_sigmoid_mul_add = _fused_gate_sigmoid_mul_add_torch
            return
    logger.debug("sglang_cpu_compat: no fused shared-expert gate in this release (0.5.13 has none)")


def _patch_deepseek_mla_torch_native():
    # DeepSeek MLA picks a forward method per attention backend; "torch_native" is not
    # registered, so the "triton" handler is used, which picks the MHA path for prefill.
    # torch_native's forward_extend always reads K/V back from the (latent) MLA KV cache,
    # so MHA prefill fails with a shape error. Use the absorbed MLA path for every mode.
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry,
        _dispatch_mla_subtype,
    )

    AttentionBackendRegistry.register("torch_native", _dispatch_mla_subtype)


def _keep_intel_amx_attention_backend():
    # server-arg post-process `_attention_backend_platform_fallbacks` rewrites
    # --attention-backend intel_amx -> torch_native when cpu_has_amx_support() is False
    # (no compiled sgl-kernel CPU ops). Our common_ops stand-in provides Python versions of
    # decode_attention_cpu/extend_attention_cpu, so keep intel_amx: it is the only CPU
    # attention backend that implements speculative decoding (verify tree masks, draft decode).
    if os.environ.get("SGLANG_CPU_COMPAT_KEEP_AMX_ATTN", "1") != "1":
        return
    try:
        from sglang.srt.arg_groups import overrides
    except ImportError:
        # Releases before arg_groups (0.5.13 ...) decide it inside ServerArgs: with
        # `not cpu_has_amx_support()` in server_args' own namespace (intel_amx fallback, and two
        # GPT-OSS-only choices). Answer True there only.
        import sglang.srt.server_args as sa

        sa.cpu_has_amx_support = lambda: True
        return
    try:  # 0.5.23 also imports the pass into attention_hook
        from sglang.srt.arg_groups import attention_hook
    except ImportError:
        attention_hook = None
    orig = overrides._attention_backend_platform_fallbacks
    if getattr(orig, "_cpu_compat", False):
        return

    def patched(view):
        if view.attention_backend == "intel_amx" and view.device == "cpu":
            return {}
        return orig(view)

    patched._cpu_compat = True
    overrides._attention_backend_platform_fallbacks = patched
    if attention_hook is not None:
        attention_hook._attention_backend_platform_fallbacks = patched
    overrides.POST_PROCESS_PASSES[:] = [patched if f is orig else f for f in overrides.POST_PROCESS_PASSES]


def _skip_triton_kv_copy_warmup():
    # Some releases (0.5.13 ...) warm up a Triton KV-copy kernel whenever speculative decoding is
    # on (MHATokenToKVPool(enable_kv_cache_copy=...)); Triton has no CPU driver. Without the
    # warm-up the pool has no copy config, which only tree (topk > 1) page moves need.
    from sglang.srt.mem_cache import memory_pool as mp

    orig = getattr(mp.MHATokenToKVPool, "_init_kv_copy_and_warmup", None)
    if orig is None or getattr(orig, "_cpu_compat", False):
        return

    def patched(self):
        if str(getattr(self, "device", "")).startswith("cpu"):
            try:
                return orig(self)
            except RuntimeError as exc:
                if "active drivers" not in str(exc):
                    raise
                self._kv_copy_config = None
                return None
        return orig(self)

    patched._cpu_compat = True
    mp.MHATokenToKVPool._init_kv_copy_and_warmup = patched


def register():
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") != "1":
        return
    for fn in (_patch_qwen2_moe_shared_gate, _patch_deepseek_mla_torch_native, _keep_intel_amx_attention_backend,
               _skip_triton_kv_copy_warmup):
        try:
            fn()
            logger.debug("sglang_cpu_compat: applied %s in pid %d", fn.__name__, os.getpid())
        except Exception:
            logger.exception("sglang_cpu_compat: %s failed", fn.__name__)
