"""The CPU shim's torch stand-in for the Qwen2-MoE shared-expert gate, in each release's place."""
import sys
import types

import torch

import sglang_cpu_compat as shim


def _inputs():
    torch.manual_seed(0)
    h, w, s, f = torch.randn(5, 8), torch.randn(8), torch.randn(5, 8), torch.randn(5, 8)
    return h, w, s, f, f + torch.sigmoid(h @ w).unsqueeze(1) * s


def test_installed_release_launcher_is_replaced_and_computes_the_gate(monkeypatch):
    from sglang.kernels.ops.elementwise import elementwise as ew

    monkeypatch.setattr(ew, "_launch_fused_gate_sigmoid_mul", ew._launch_fused_gate_sigmoid_mul)
    shim._patch_qwen2_moe_shared_gate()
    assert ew._launch_fused_gate_sigmoid_mul is shim._fused_gate_sigmoid_mul_torch
    h, w, s, f, want = _inputs()
    ew._launch_fused_gate_sigmoid_mul(h, w, s, f, do_add=True)
    assert torch.allclose(f, want, atol=1e-6)


def test_release_that_imports_the_gate_by_name(monkeypatch):
    """0.5.14-0.5.18: models/qwen2_moe.py does ``from <module> import fused_gate_sigmoid_mul_add``."""
    def triton_only(*args):
        raise RuntimeError("0 active drivers")

    src = types.ModuleType("fake_release_elementwise")
    src.fused_gate_sigmoid_mul_add = triton_only
    model = types.ModuleType("sglang.srt.models.qwen2_moe")
    model.fused_gate_sigmoid_mul_add = triton_only
    monkeypatch.setitem(sys.modules, src.__name__, src)
    monkeypatch.setitem(sys.modules, model.__name__, model)
    monkeypatch.setattr(shim, "_GATE_MODULES", ("no_such_module_here", src.__name__))
    shim._patch_qwen2_moe_shared_gate()
    h, w, s, f, want = _inputs()
    model.fused_gate_sigmoid_mul_add(h, w, s, f)
    assert torch.allclose(f, want, atol=1e-6)
    assert src.fused_gate_sigmoid_mul_add is model.fused_gate_sigmoid_mul_add


def test_release_without_the_gate_is_left_alone(monkeypatch):
    monkeypatch.setattr(shim, "_GATE_MODULES", ("no_such_module_here",))
    shim._patch_qwen2_moe_shared_gate()  # 0.5.13: nothing to replace, nothing raised
