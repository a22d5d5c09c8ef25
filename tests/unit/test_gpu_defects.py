"""One test per defect a line-by-line read of the CUDA paths found (each failed before its fix).

On the simulated device (``testing/fake_cuda``, made faithful where these paths rely on it) through
the real hooks, Profiler, CudaEventClock and GraphTimer, except where a pure function is the fix:

1. only the target runner's TARGET_VERIFY graphs carry event nodes (not draft/draft-extend graphs);
2. events live as long as any graph that records them (``_disable``, re-capture), released by cleanup;
3. the EAGLE eager fallback gives one answer per step to SGLang's two ``can_run_graph`` calls;
4. each record's timing label says what ran on that step;
5. roofline: bytes and time from the same steps, attention TP size under attention-DP, sparse models;
6. ``elapsed_ms`` of a pair spanning two streams asks both events;
7. the overlap gate depends on configuration and step id only (not on one rank's state);
8. DeepEPMoE is hooked and the status reports which attention/MoE classes are covered;
9. unsampled replays, and every replay after ``disable``, pay nothing for the events.
"""

from __future__ import annotations

import gc

import pytest

import gpu_fakes as gf
from fakes import Batch, Req
from test_graph_timing import K, build, records, traffic  # noqa: F401 - shared builders
from test_graph_timing import cleanup  # noqa: F401 - the fixture
from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.collect import adapter
from sglang_ctxprof.collect.clocks import CudaEventClock
from sglang_ctxprof.collect.graph_clock import GraphTimer
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.roofline import hw_meta, kv_bytes_per_token
from sglang_ctxprof.testing.fake_cuda import FakeDevice
from sglang_ctxprof.views.profile import build_profile


# ---- 1 ------------------------------------------------------------------------------------------
def test_draft_graphs_carry_no_event_nodes(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    w = sched.model_worker
    assert all(g.events() == 0 for g in w.draft_runner.backend._graphs.values())
    assert w.target.backend._graphs["bs1"].events() == 0
    assert p.graph.blocks == {"Attn", "MoE"} and p.graph.events == 2 * 2 * gf.LAYERS


# ---- 2 ------------------------------------------------------------------------------------------
def test_disable_keeps_the_events_live_graphs_record(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    backend = sched.model_worker.target.backend
    graphs = list(backend._graphs.values())
    p.graph._disable("record failed (test)")
    gc.collect()
    fresh = [gf.DEV.Event(enable_timing=True) for _ in range(8)]  # would take freed handles
    for g in graphs:  # a replay records into whatever event holds a freed handle now (P6)
        g.replay()
    traffic(sched, 5)  # SGLang keeps serving; the split is unavailable from now on
    assert len(records(p)) == 5 and p.guard.status() is None
    assert gf.DEV.stray_records == 0 and fresh


def test_recapture_retires_the_old_set_until_cleanup(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    backend = sched.model_worker.target.backend
    old = dict(backend._graphs)  # something may still hold the old graphs
    backend.capture_one("bs1", sched.model_worker.target.model.forward)
    gc.collect()
    fresh = [gf.DEV.Event(enable_timing=True) for _ in range(8)]
    for g in old.values():
        g.replay()
    assert gf.DEV.stray_records == 0 and fresh
    assert p.graph.events == 2 * 2 * 2 * gf.LAYERS  # old and new copies' events both alive
    backend.cleanup()
    assert p.graph.events == 0 and p.graph.released == 2 * 2 * 2 * gf.LAYERS
    assert p.status()["split"]["timed_copies"]["shapes"] == 0


def test_cleanup_is_hooked_even_while_timing_is_off():
    t = next(t for t in adapter.TARGETS if t.hook == "graph_cleanup")
    assert t.path.endswith("FullCudaGraphBackend.cleanup") and t.group == "control"


# ---- 3 ------------------------------------------------------------------------------------------
def test_eager_fallback_is_decided_once_per_step(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, external=False, fallback="eager")
    cleanup.append((p, inst))
    traffic(sched, 8)  # the fake raises if prepare-for-verify and the forward disagree
    recs = records(p)
    assert len(recs) == 8 and p.guard.status() is None
    assert [r.step_id for r in recs if "verify_attn" in r.phases_ms] == [4, 8]


# ---- 4 ------------------------------------------------------------------------------------------
def test_timing_label_says_what_ran_on_each_step(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    runner = sched.model_worker.target.runner
    reqs = [Req("a", 100)]
    for i in range(1, 9):
        runner.use_graph = i not in (3, 4)  # steps 3 and 4: batch larger than the largest captured
        b = Batch(reqs)
        sched.process_batch_result(b, sched.run_batch(b))
    labels = {r.step_id: r.timing for r in records(p)}
    assert labels == {1: "cuda_graph", 2: "cuda_graph", 3: "cuda_events", 4: "cuda_events",
                      5: "cuda_graph", 6: "cuda_graph", 7: "cuda_graph", 8: "cuda_graph_events"}
    eager4 = next(r for r in records(p) if r.step_id == 4)
    assert eager4.phases_ms["verify_attn"] == pytest.approx(gf.expected(4)["verify_attn"])


def test_verify_graph_ran_reads_the_result():
    class R:
        can_run_cuda_graph = True
    assert adapter.verify_graph_ran(R()) is True
    assert adapter.verify_graph_ran(object()) is None


# ---- 5 ------------------------------------------------------------------------------------------
def _rec(step_id, ctx, attn_ms=None):
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
    agg.observe(_rec(64, 1000, attn_ms=1.0))
    for i in range(1, 8):
        agg.observe(_rec(64 + i, 1023))
    b = build_profile(agg.snapshot().with_hw(hw)).buckets[0]
    assert b.roofline["kv_bytes_per_step"] == pytest.approx(1000 * kv_bytes_per_token(facts))


def test_roofline_uses_the_attention_tp_size_under_attention_dp():
    gqa = {"layers": 2, "kv_dtype_bytes": 2, "attention": "gqa", "num_kv_heads": 8, "head_dim": 128}
    assert kv_bytes_per_token({**gqa, "tp_size": 8, "attn_tp_size": 2}) == 2 * 4 * 128 * 2 * 2
    assert kv_bytes_per_token({**gqa, "tp_size": 8}) == 2 * 1 * 128 * 2 * 2

    class SA:
        enable_dp_attention, dp_size = True, 4
    assert adapter.attn_tp_size(type("S", (), {"server_args": SA()})(), 8) == 2  # no parallel context here


def test_roofline_is_unavailable_for_sparse_attention():
    facts = {"layers": 1, "kv_dtype_bytes": 2, "attention": "mla", "kv_lora_rank": 512, "qk_rope_head_dim": 64,
             "tp_size": 1, "sparse": "sparse attention (DSA/NSA, index_topk=2048)"}
    agg = Aggregator()
    agg.observe(_rec(64, 1000, attn_ms=1.0))
    r = build_profile(agg.snapshot().with_hw(hw_meta(facts, "NVIDIA H200"))).buckets[0].roofline
    assert r["available"] is False and "DSA" in r["reason"]

    class HF:
        sliding_window, use_sliding_window = 4096, True

    class HFOff:
        sliding_window, use_sliding_window = 4096, False
    assert "sliding" in adapter.sparse_attention(type("MC", (), {"hf_text_config": HF()})())
    assert adapter.sparse_attention(type("MC", (), {"hf_text_config": HFOff()})()) == ""


# ---- 6 ------------------------------------------------------------------------------------------
def test_elapsed_ms_of_a_cross_stream_pair_waits_for_both():
    dev = FakeDevice()
    clock = CudaEventClock(event_factory=lambda: dev.Event(enable_timing=True))
    s1, s2 = dev.Stream(), dev.Stream()
    with dev.stream(s1):
        dev.kernel(5.0)
        a = clock.mark()  # start on s1, behind a long kernel
    with dev.stream(s2):
        b = clock.mark()  # end on s2, which has nothing before it
    dev.advance(b)
    assert b.query() and not a.query()
    assert clock.elapsed_ms(a, b) is None  # not an exception that would turn profiling off
    dev.run()
    assert clock.elapsed_ms(a, b) is not None


# ---- 7 ------------------------------------------------------------------------------------------
def test_overlap_gate_is_the_same_on_every_rank():
    rank0 = GraphTimer(lambda: None, lambda: False, sample_every=1)
    rank1 = GraphTimer(lambda: None, lambda: False, sample_every=1)
    rank1._sets[("b", "bs1")] = [("verify_attn", None, None)]  # rank 1 captured a timed copy,
    rank0._disable("record failed on this rank only")  # rank 0 lost its external events
    for last in (None, 1, 2, 3):
        assert rank0.hold_overlap(last, (last or 0) + 1) == rank1.hold_overlap(last, (last or 0) + 1)


# ---- 8 ------------------------------------------------------------------------------------------
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


# ---- 9 ------------------------------------------------------------------------------------------
def test_unsampled_steps_pay_nothing_for_event_nodes(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, record_cost_ms=0.125)
    cleanup.append((p, inst))
    traffic(sched, 8)
    for r in records(p):
        if r.step_id % K:  # the plain graph ran: verify takes exactly the kernels' time
            assert r.phases_ms["verify"] == pytest.approx(gf.expected(r.step_id)["verify"])
    inst.disable()  # off: the hooks are gone and SGLang replays its own graph, which has no nodes
    backend = sched.model_worker.target.backend
    assert backend._graphs["bs1"].events() == 0


def test_every_rank_captures_the_same_graphs_even_after_a_local_failure(monkeypatch, cleanup):
    """TP ranks pair their warm-up barriers and collectives: a rank whose events failed must still
    capture the timed copy (without events), else the ranks' captures no longer match."""
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    backend = sched.model_worker.target.backend
    before = backend.captures
    p.graph._disable("record failed on this rank only")
    backend.capture_one("bs2", sched.model_worker.target.model.forward)
    assert backend.captures - before == 2 and adapter.has_graph(backend, adapter.timed_shape_key("bs2"))
    assert p.graph.events == 2 * 2 * gf.LAYERS  # the new copy carries no events: this rank reads none


def test_profile_timing_is_the_best_label_seen_not_the_last():
    agg = Aggregator()
    for i, label in enumerate(("cuda_graph", "cuda_graph_events", "cuda_graph", "cuda_events")):
        r = _rec(60 + i, 1000)
        agg.observe(StepRecord.from_dict({**r.to_dict(), "timing": label}))
    assert agg.snapshot().timing == "cuda_graph_events"
