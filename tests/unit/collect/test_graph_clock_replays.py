"""The CUDA-graph attention/MoE split on a simulated device, through the real hooks and Profiler.

Covers: feature detection of ``external=``; the timed copy of the target verify graph (warm-ups
skipped, the plain graph untouched); exact split on sampled steps; "left out, not zero" on the
others; the overlap gate, needed only when consecutive steps are sampled, and without it a
discarded read instead of another step's numbers; events not complete yet -> split unavailable,
step parked and retried; the eager fallback; no synchronize anywhere; the gate decision identical
on every rank; the real SGLang targets resolve with our signatures.  The defects found by reading
the CUDA paths have their own tests in ``test_graph_clock_defects``.
"""

from __future__ import annotations

import pytest

import gpu_fakes as gf
from fakes import Batch, Req
from graph_rig import K, build, cleanup, records, traffic  # noqa: F401 - fixture and builders
from sglang_ctxprof.collect import adapter, graph_hooks, hooks
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory
from sglang_ctxprof.collect.instrumentor import check_signature, resolve
from sglang_ctxprof.model.names import TIMING_CUDA_EVENTS, TIMING_CUDA_GRAPH_EVENTS

TIMING_CUDA_GRAPH = "cuda_graph"


def test_feature_detection():
    f, reason = external_event_factory(gf.reset(supports_external=False).Event)
    assert f is None and "external" in reason
    f, reason = external_event_factory(gf.reset().Event)
    assert f is not None and f().external and reason == ""


def test_sampled_steps_get_the_exact_split_others_leave_it_out(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    # capture skipped the two warm-ups: one event pair per block of the timed copy only
    assert p.graph.events == 2 * 2 * gf.LAYERS and len(p.graph._sets) == 1
    backend = sched.model_worker.target.backend
    assert backend._graphs["bs1"].events() == 0  # SGLang's own graph carries no event node
    assert backend._graphs[adapter.timed_shape_key("bs1")].events() == 2 * 2 * gf.LAYERS
    traffic(sched, 13)
    recs = records(p)
    assert [r.step_id for r in recs] == list(range(1, 14))
    assert [r.timing for r in recs] == [TIMING_CUDA_GRAPH_EVENTS if r.step_id % K == 0 else TIMING_CUDA_GRAPH
                                        for r in recs]
    for r in recs:
        want = gf.expected(r.step_id)
        assert r.phases_ms["verify"] == pytest.approx(want["verify"])
        assert r.phases_ms["draft"] == pytest.approx(want["draft"])
        if r.step_id % K == 0:
            assert r.phases_ms["verify_attn"] == pytest.approx(want["verify_attn"])
            assert r.phases_ms["verify_moe"] == pytest.approx(want["verify_moe"])
            assert r.leaf_sum_ms() == pytest.approx(r.step_ms)
        else:  # inside a graph on an unsampled step: unknown, so absent (never 0)
            assert "verify_attn" not in r.phases_ms and "verify_moe" not in r.phases_ms
    d = p.status()["split"]
    assert d["mode"] == "cuda_graph_events" and d["sampled_reads"] == 3 and d["overwritten"] == 0
    assert p.status()["timing"] == TIMING_CUDA_GRAPH_EVENTS
    assert gf.DEV.syncs == 0  # we never synchronize; reads only query()
    assert p.guard.status() is None


def test_without_overlap_gate_k1_reads_are_discarded_not_wrong(monkeypatch, cleanup):
    """Every step sampled (K = 1): step N+1 replays the timed copy before N is read."""
    p, inst, sched = build(monkeypatch, gate=False, k=1)
    cleanup.append((p, inst))
    traffic(sched, 8)
    recs = records(p)
    assert len(recs) == 8
    # the last step has no successor to overwrite it; every other read is discarded, never wrong
    assert [r.step_id for r in recs if "verify_attn" in r.phases_ms] == [8]
    assert p.graph.overwritten == 7 and p.graph.sampled_reads == 1


def test_with_overlap_gate_k1_every_step_is_read(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, k=1)
    cleanup.append((p, inst))
    traffic(sched, 8)
    recs = records(p)
    for r in recs:
        assert r.phases_ms["verify_attn"] == pytest.approx(gf.expected(r.step_id)["verify_attn"])
    assert p.graph.overwritten == 0 and p.graph.sampled_reads == 8


def test_timed_copy_needs_no_gate_when_k_is_2_or_more(monkeypatch, cleanup):
    """Unsampled steps replay the plain graph, so the copy's events wait K steps untouched."""
    p, inst, sched = build(monkeypatch, gate=False)
    cleanup.append((p, inst))
    traffic(sched, 13)
    recs = records(p)
    for r in recs:
        if r.step_id % K == 0:
            assert r.phases_ms["verify_attn"] == pytest.approx(gf.expected(r.step_id)["verify_attn"])
    assert p.graph.overwritten == 0 and p.graph.sampled_reads == 3


def test_overlap_gate_decision_comes_from_the_step_counter(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, k=1)
    cleanup.append((p, inst))
    assert graph_hooks.overlap_gate(lambda *a: False, sched, None, None) is False  # no last batch: no hold
    assert graph_hooks.overlap_gate(lambda *a: True, sched, None, None) is True  # SGLang's own True stays
    b = Batch([])
    b.forward_iter = 5
    sched.forward_ct = 5
    assert graph_hooks.overlap_gate(lambda *a: False, sched, None, b) is True
    # K = 4: two consecutive steps are never both sampled, so the gate never holds
    g4 = GraphTimer(lambda: None, lambda: False, sample_every=K)
    assert not any(g4.hold_overlap(s, s + 1) for s in range(1000))


def test_device_behind_host_parks_and_retries_never_reads_early(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, device_sync=False)
    cleanup.append((p, inst))
    traffic(sched, 6)
    assert records(p) == [] and len(p.parked) == 6  # nothing read before the device got there
    assert p.graph.unready == 1  # the sampled step's graph read is dropped, not retried
    gf.DEV.run()  # the device catches up
    sched.device_sync = True
    sched.loop_overlap([Batch([Req("c", 50)])])
    recs = records(p)
    assert [r.step_id for r in recs] == list(range(1, 8)) and p.unresolved == 0
    assert not any("verify_attn" in r.phases_ms for r in recs[:6])
    assert gf.DEV.syncs == 0 and p.guard.status() is None


def test_no_external_events_split_unavailable(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, external=False)
    cleanup.append((p, inst))
    assert p.graph.events == 0
    traffic(sched, 9)
    recs = records(p)
    assert len(recs) == 9 and not any("verify_attn" in r.phases_ms for r in recs)
    d = p.status()["split"]
    assert d["mode"] == "unavailable_under_graphs" and "external" in d["reason"]
    assert p.status()["timing"] == TIMING_CUDA_EVENTS


def test_eager_fallback_times_sampled_steps_with_plain_events(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, external=False, fallback="eager")
    cleanup.append((p, inst))
    traffic(sched, 9)
    recs = records(p)
    for r in recs:
        if r.step_id % K == 0:
            want = gf.expected(r.step_id)
            assert r.phases_ms["verify_attn"] == pytest.approx(want["verify_attn"])
            assert r.phases_ms["verify_moe"] == pytest.approx(want["verify_moe"])
        else:
            assert "verify_attn" not in r.phases_ms
    assert p.graph.eager_forced == 2 and p.status()["split"]["mode"] == "eager_sampled"
    # SGLang asks the target runner twice per EAGLE step; both answers agreed (else the fake raises)
    assert sched.model_worker.target.runner.calls == 2 * 9
    assert [r.timing for r in recs if r.step_id % K == 0] == [TIMING_CUDA_EVENTS] * 2


def test_eager_cuda_plain_block_events_every_step(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch, use_graph=False)
    cleanup.append((p, inst))
    traffic(sched, 5)
    recs = records(p)
    assert len(recs) == 5
    for r in recs:
        want = gf.expected(r.step_id)
        assert r.phases_ms["verify_attn"] == pytest.approx(want["verify_attn"])
        assert r.phases_ms["verify_moe"] == pytest.approx(want["verify_moe"])
        assert r.timing == TIMING_CUDA_EVENTS
    assert p.clock.created <= 40  # events come back to the pool


def test_bad_sampling_config():
    with pytest.raises(ValueError):
        GraphTimer(None, lambda: False, sample_every=0)
    with pytest.raises(ValueError):
        CtxProfConfig.from_env({"SGLANG_CTXPROF_GRAPH_FALLBACK": "sometimes"})
    with pytest.raises(ValueError):
        CtxProfConfig.from_env({"SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY": "zero"})


def test_real_sglang_graph_targets_resolve():
    for t in adapter.TARGETS:
        if t.hook not in ("graph_capture", "graph_replay", "graph_cleanup", "overlap_gate", "graph_eager_fallback"):
            continue
        _, _, fn = resolve(t.path)
        assert check_signature(fn, adapter.SIGNATURES.get(t.path, ())) is None, t.path
