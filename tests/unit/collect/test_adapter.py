"""``collect/adapter``: the SGLang facts the adapter reads and the targets it hooks.

What the CUDA-path read found here: the graph cleanup is hooked even while timing is off, the
verify graph's use is read from the result, DeepEPMoE is hooked, and the status says which
attention/MoE classes of the model are covered.
"""

from __future__ import annotations

import gpu_fakes as gf
from graph_rig import build, cleanup  # noqa: F401 - fixture and builder
from sglang_ctxprof.collect import adapter


def test_cleanup_is_hooked_even_while_timing_is_off():
    t = next(t for t in adapter.TARGETS if t.hook == "graph_cleanup")
    assert t.path.endswith("FullCudaGraphBackend.cleanup") and t.group == "control"


def test_verify_graph_ran_reads_the_result():
    class R:
        can_run_cuda_graph = True
    assert adapter.verify_graph_ran(R()) is True
    assert adapter.verify_graph_ran(object()) is None


def test_deepep_moe_is_hooked():
    t = next((t for t in adapter.TARGETS if t.path.endswith("DeepEPMoE.forward")), None)
    assert t is not None and t.hook == "moe"


def test_status_reports_model_coverage(monkeypatch, cleanup):
    class Mod:
        def named_children(self):
            return list(self.__dict__.items())

    class DeepEPMoE(Mod):  # overrides forward; not hooked here
        def forward(self):
            return None

    class Layer(Mod):
        def __init__(self):
            self.attn, self.mlp = gf.Attn(), DeepEPMoE()

    class Net(Mod):
        def __init__(self):
            self.l0, self.l1 = Layer(), Layer()

    for cls in (gf.Attn,):  # our hook targets behave like nn.Modules here
        monkeypatch.setattr(cls, "named_children", lambda self: [], raising=False)
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    monkeypatch.setattr(adapter, "TARGETS", adapter.TARGETS + tuple(
        adapter.Target(path, hook) for path, hook in gf.TARGETS_SPEC if hook in ("attn", "moe")))
    cov = adapter.model_coverage(None, Net())
    assert cov["attn"] == {"Attn": 2} and cov["moe"] == {} and cov["moe_unhooked"] == {"DeepEPMoE": 2}
    sched.tp_worker = type("W", (), {"model_runner": type("R", (), {"model": Net()})()})()
    st = p.status()["coverage"]
    assert st["available"] and st["moe_unhooked"] == {"DeepEPMoE": 2} and st["graph_blocks"] == ["Attn", "MoE"]


def test_attention_tp_size_under_attention_dp():
    class SA:
        enable_dp_attention, dp_size = True, 4
    assert adapter.attn_tp_size(type("S", (), {"server_args": SA()})(), 8) == 2  # no parallel context here


def test_the_first_rank_of_each_attention_group_emits(monkeypatch):
    """DP attention, tp 4 dp 2: attention TP 2, so tp ranks 0 and 2 each lead a group's requests."""
    class SA:
        enable_dp_attention, dp_size, tp_size = True, 2, 4
    sched = lambda tp: type("S", (), {"server_args": SA(), "tp_rank": tp})()  # noqa: E731
    assert [adapter.emits(sched(tp)) for tp in range(4)] == [True, False, True, False]  # no parallel context
    SA.enable_dp_attention = False
    assert [adapter.emits(sched(tp)) for tp in range(4)] == [True, False, False, False]
    from sglang.srt import runtime_context

    ctx = type("P", (), {"attn_tp_rank": 0, "attn_cp_rank": 0})()
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: ctx)
    assert adapter.emits(sched(3))  # SGLang's parallel context decides where there is one
    ctx.attn_cp_rank = 1
    assert not adapter.emits(sched(0))


def test_sliding_window_is_sparse_attention_only_when_used():
    class HF:
        sliding_window, use_sliding_window = 4096, True

    class HFOff:
        sliding_window, use_sliding_window = 4096, False
    assert "sliding" in adapter.sparse_attention(type("MC", (), {"hf_text_config": HF()})())
    assert adapter.sparse_attention(type("MC", (), {"hf_text_config": HFOff()})()) == ""
