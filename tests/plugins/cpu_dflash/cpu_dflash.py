"""Test-only SGLang plugin: let DFLASH past SGLang's device check on a CPU.

SGLang 0.5.23 refuses DFLASH on CPU at argument validation (``_handle_dflash`` in
arg_groups/speculative_hook.py: "DFLASH speculative decoding is not supported by CpuSRTPlatform on
device 'cpu'").  This plugin answers that one module's platform questions as an out-of-tree
platform that supports DFLASH with the intel_amx draft attention backend; everything else is the
real platform.  It changes nothing on CUDA.
"""

from __future__ import annotations



class _Platform:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def is_out_of_tree(self):
        return True

    def supports_speculative_algorithm(self, algorithm):
        return algorithm == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm, backend):
        return backend == "intel_amx"

    def get_default_speculative_draft_attention_backend(self, algorithm):
        return "intel_amx"


def register() -> None:
    import torch

    if torch.cuda.is_available():
        return
    if not getattr(torch.Tensor.record_stream, "_cpu_noop", False):
        real = torch.Tensor.record_stream

        def record_stream(self, stream):  # a CPU tensor has no stream to be recorded on
            if self.device.type == "cpu":
                return None
            return real(self, stream)

        record_stream._cpu_noop = True
        torch.Tensor.record_stream = record_stream
    from sglang.srt.arg_groups import speculative_hook

    if not isinstance(speculative_hook.current_platform, _Platform):
        speculative_hook.current_platform = _Platform(speculative_hook.current_platform)
    from sglang.srt.speculative import draft_worker_common
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang.srt.models.dflash import DFlashAttention

    if not getattr(DFlashAttention.__init__, "_cpu_eager", False):
        init = DFlashAttention.__init__

        def __init__(self, *args, **kwargs):  # the fused q/k-norm + RoPE kernel is Triton (GPU) only
            init(self, *args, **kwargs)
            self.use_table_qk_norm_rope = False

        __init__._cpu_eager = True
        DFlashAttention.__init__ = __init__
    if not hasattr(DFlashVerifyInput, "tree_topk"):  # intel_amx gates its tree mask on it: a chain
        DFlashVerifyInput.tree_topk = 1

    choices = draft_worker_common.DRAFT_ATTENTION_BACKEND_CHOICES
    if "intel_amx" not in choices:  # else the draft runner falls back to FlashInfer (CUDA only)
        draft_worker_common.DRAFT_ATTENTION_BACKEND_CHOICES = [*choices, "intel_amx"]
