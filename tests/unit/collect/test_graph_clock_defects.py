"""``collect/graph_clock``: the defects a line-by-line read of the CUDA paths found (each failed before its fix).

On the simulated device (``testing/fake_cuda``, made faithful where these paths rely on it) through
the real hooks, Profiler, CudaEventClock and GraphTimer:

1. only the target runner's TARGET_VERIFY graphs carry event nodes (not draft/draft-extend graphs);
2. events live as long as any graph that records them (``_disable``, re-capture), released by cleanup;
3. the EAGLE eager fallback gives one answer per step to SGLang's two ``can_run_graph`` calls;
4. each record's timing label says what ran on that step;
7. the overlap gate depends on configuration and step id only (not on one rank's state);
9. unsampled replays, and every replay after ``disable``, pay nothing for the events.

The same read's other defects are tested by their modules: 5 (roofline) in model/test_roofline.py,
6 (cross-stream ``elapsed_ms``) in collect/test_clocks.py, 8 (DeepEPMoE, coverage) in
collect/test_adapter.py, the profile's timing label in aggregate/test_aggregator.py.
"""

from __future__ import annotations

import gc

import pytest

import gpu_fakes as gf
from fakes import Batch, Req
from graph_rig import K, build, records, traffic  # noqa: F401 - shared builders
from graph_rig import cleanup  # noqa: F401 - the fixture
from sglang_ctxprof.collect import adapter
from sglang_ctxprof.collect.graph_clock import GraphTimer


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


# ---- 7 ------------------------------------------------------------------------------------------
def test_overlap_gate_is_the_same_on_every_rank():
    rank0 = GraphTimer(lambda: None, lambda: False, sample_every=1)
    rank1 = GraphTimer(lambda: None, lambda: False, sample_every=1)
    rank1._sets[("b", "bs1")] = [("verify_attn", None, None)]  # rank 1 captured a timed copy,
    rank0._disable("record failed on this rank only")  # rank 0 lost its external events
    for last in (None, 1, 2, 3):
        assert rank0.hold_overlap(last, (last or 0) + 1) == rank1.hold_overlap(last, (last or 0) + 1)


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
