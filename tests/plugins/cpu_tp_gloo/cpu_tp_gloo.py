"""Test-only SGLang plugin: let ``--tp-size 2`` start on a CPU (gloo) by not creating PyNccl groups.

SGLang 0.5.23 builds every parallel group with ``use_pynccl=True`` unless the platform is NPU/XPU
or an out-of-tree platform without pynccl (``parallel_state.init_model_parallel_group``); on CPU
``PyNcclCommunicator`` then fails with "Expected a cuda device, but got: cpu".  This BEFORE hook
passes ``use_pynccl=False`` when CUDA is unavailable.  Path-loaded by tests/server/test_multirank.py.
"""

from __future__ import annotations



def _no_pynccl(*args, **kwargs):
    kwargs["use_pynccl"] = False
    return args, kwargs


def register() -> None:
    import torch

    if torch.cuda.is_available():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.distributed.parallel_state.init_model_parallel_group",
                          _no_pynccl, HookType.BEFORE)
