"""Every rank replays the same graph: the replay rule of ``collect/graph_clock`` across ranks.

SGLang's in-graph collectives (custom all-reduce) pair buffers registered at capture, in capture
order, so ranks that replay different graphs read stale buffers (wrong tokens, no error) or wait
in collectives their peers never enter.  These tests run two ranks in lockstep on simulated
devices (``gpu_fakes.Ranks``; ``testing/fake_comm`` raises ``CollectiveMismatch`` where a GPU
would corrupt or hang) through the real hooks, profiler and graph timer, and try each way one
rank's own state could change what it replays: an idle DP rank, a guard trip, a toggle handled on
different steps, a failed read, a failed timed capture, the eager fallback.  Then the single-rank
cases: a capture hook that registers state (DSPARK), a recapture without ``cleanup``, the event
cap, and overlapping streams.
"""

from __future__ import annotations

import gc

import pytest

import gpu_fakes as gf
from graph_rig import K, build, cleanup, records, traffic  # noqa: F401 - fixture and builders
from sglang_ctxprof.collect import graph_clock
from sglang_ctxprof.testing.fake_comm import CollectiveMismatch

SAMPLED = [s for s in range(1, 13) if s % K == 0]


@pytest.fixture
def ranks():
    made = []

    def make(n=2, **kw):
        r = gf.Ranks(n, k=K, **kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def run(rk, steps, batches=lambda step, r: gf.decode(f"r{r}"), between=None):
    for step in range(1, steps + 1):
        rk.step([batches(step, r) for r in range(rk.n)])
        if between is not None:
            between(step)
    rk.drain()
    assert rk.comm.in_step() and rk.comm.paired > 0


def split_steps(recs):
    return [r.step_id for r in recs if "verify_attn" in r.phases_ms]


def test_an_idle_rank_replays_what_the_busy_rank_replays(ranks):
    rk = ranks()
    run(rk, 12, lambda step, r: gf.decode("a") if r == 0 else gf.decode())  # rank 1 is an idle DP rank
    assert split_steps(rk.records(0)) == SAMPLED
    assert rk.records(1) == []  # an idle rank records nothing, yet replayed the timed copies
    assert [s.profiler.graph.timed_replays for s in rk.sessions] == [len(SAMPLED)] * 2


def test_a_guard_trip_on_one_rank_changes_no_replay(ranks):
    rk = ranks()

    def trip(step):
        if step == 2:
            rk.sessions[1].profiler.guard.fail("hooks", RuntimeError("a hook failed on rank 1 only"))
    run(rk, 12, between=trip)
    assert split_steps(rk.records(0)) == SAMPLED
    assert rk.sessions[1].profiler.guard.status() is not None


def test_a_toggle_handled_on_different_steps(ranks):
    rk = ranks()

    def toggle(step):
        for r, off, on in ((0, 3, 9), (1, 6, 10)):  # each rank gets the request at another step
            with rk.use(r):
                if step == off:
                    rk.sessions[r].disable()
                elif step == on:
                    rk.sessions[r].enable()
    run(rk, 16, between=toggle)
    assert split_steps(rk.records(0)) == [4 * i for i in range(1, 5) if not 3 < 4 * i <= 9]


def test_a_failed_read_on_one_rank_is_dropped_and_counted(ranks):
    rk = ranks()
    real = rk.devs[1].Event.elapsed_time

    def broken(self, end):
        if self.external:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self, end)
    rk.devs[1].Event.elapsed_time = broken
    run(rk, 12)
    g1 = rk.sessions[1].profiler.graph
    assert g1.read_errors == len(SAMPLED) and split_steps(rk.records(1)) == []
    assert rk.sessions[1].profiler.guard.status() is None  # the rest of the profile goes on
    assert split_steps(rk.records(0)) == SAMPLED


def test_a_timed_capture_that_fails_on_one_rank_stops_the_start_cleanly(ranks):
    """Its peers are inside the copy's warm-ups: going on would desync them; SGLang alone would
    have failed at this point too."""
    with pytest.raises(RuntimeError, match="timed copy") as err:
        ranks(fail_copy_on=1)
    assert not isinstance(err.value, CollectiveMismatch)
    assert "SGLANG_CTXPROF_GRAPH_TIMED_SHAPES=none" in str(err.value)


def test_eager_fallback_runs_the_same_step_eagerly_on_every_rank(ranks):
    rk = ranks(external=False, fallback="eager")
    run(rk, 12, lambda step, r: gf.decode("a") if r == 0 else gf.decode())
    assert split_steps(rk.records(0)) == SAMPLED
    assert [s.profiler.graph.eager_forced for s in rk.sessions] == [len(SAMPLED)] * 2


# ---- one rank -----------------------------------------------------------------------------------
def test_a_failed_timed_capture_on_a_single_rank_drops_every_copy(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    target = sched.model_worker.target
    target.backend.fail_copy = True
    target.backend.capture_one("bs2", target.run_once)
    traffic(sched, 8)
    assert split_steps(records(p)) == []
    copies = p.status()["split"]["timed_copies"]
    assert copies["shapes"] == 0 and "out of memory" in copies["off"]
    assert p.graph.timed_replays == 0


def test_a_runner_whose_capture_registers_state_gets_no_timed_copy(monkeypatch, cleanup):
    """DSPARK's epilogue stores the captured graph's outputs at capture; a second capture of the
    shape would point it at the copy, and unsampled steps would read the copy's stale outputs."""
    monkeypatch.setattr(gf, "TargetWorker", _with_state(gf.TargetWorker))
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    traffic(sched, 12)
    state = sched.model_worker.target.capture_state
    assert state.reads == 12 and state.stale == 0
    copies = p.status()["split"]["timed_copies"]
    assert copies["shapes"] == 0 and "capture_hook" in copies["refused"][0]


def _with_state(cls):
    class WithState(cls):
        def __init__(self, use_graph, **kw):
            kw["capture_state"] = gf.CaptureState()
            super().__init__(use_graph, **kw)
    return WithState


def test_a_recapture_without_cleanup_releases_the_old_events(monkeypatch, cleanup):
    """A weight update with recapture replaces the runner and never calls ``cleanup``."""
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    one_set = 2 * 2 * gf.LAYERS
    target = sched.model_worker.target
    for _ in range(3):
        target.runner = gf.GraphRunner(True)
        target.backend = target.runner.backend
        target.backend.capture_one("bs1", target.run_once)
        gc.collect()
    traffic(sched, 8)
    assert p.graph.events == one_set and p.graph.released == 3 * one_set
    assert split_steps(records(p)) == [4, 8]


def test_a_backend_that_does_not_keep_its_runner_still_gets_timed_copies(monkeypatch, cleanup):
    """SGLang 0.5.16's FullCudaGraphBackend keeps no ``_cuda_graph_runner``: the first H200 run
    served with CUDA graphs and captured no timed copy at all (status: 0 shapes, no refusal)."""
    monkeypatch.setattr(gf, "KEEPS_RUNNER", False)
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    assert not hasattr(sched.model_worker.target.backend, "_cuda_graph_runner")
    traffic(sched, 8)
    assert split_steps(records(p)) == [4, 8]
    assert p.status()["split"]["timed_copies"]["shapes"] == 1
    assert p.capture_runner is None  # only while a runner captures


def test_the_event_cap_turns_the_split_off_with_a_reason(monkeypatch, cleanup):
    monkeypatch.setattr(graph_clock, "MAX_EVENTS", 4)
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    traffic(sched, 8)
    assert split_steps(records(p)) == []
    split = p.status()["split"]
    assert split["mode"] == "unavailable_under_graphs" and "MAX_EVENTS" in split["reason"]


def test_phases_on_overlapping_streams_still_tile_the_step(monkeypatch, cleanup):
    """The draft runs on a side stream while verify runs on the forward stream: on a GPU they
    overlap, so the phases add up to more than the step's span."""
    monkeypatch.setattr(gf, "Worker", SideDraftWorker)
    gf.reset(concurrent=True)
    p, inst, sched = build(monkeypatch, concurrent=True)
    cleanup.append((p, inst))
    traffic(sched, 4)
    recs = records(p)
    for r in recs:
        want = gf.expected(r.step_id)
        assert r.phases_ms["draft"] == pytest.approx(want["draft"])
        assert r.phases_ms["verify"] == pytest.approx(want["verify"])
        span = max(want["draft"], want["verify"]) + gf.DRAFT_EXT_MS + gf.OVERHEAD_MS
        named = want["draft"] + want["verify"] + gf.DRAFT_EXT_MS
        # the phases overlap, so they add up to more than the span: the step is their sum, and the
        # host overhead that the overlap hid is 0
        assert r.step_ms == pytest.approx(named) and named > span and r.phases_ms["overhead"] == 0.0
    sampled = [r for r in recs if r.step_id % K == 0]
    assert sampled and all(r.leaf_sum_ms() == pytest.approx(r.step_ms) for r in sampled)


class SideDraftWorker(gf.Worker):
    def forward_batch_generation(self, batch):
        dev = gf.DEV
        side = getattr(self, "side", None) or dev.Stream("draft")
        self.side = side
        side.wait_stream(dev.current)
        with dev.stream(side):
            self.draft(batch)
        prepared = self.target.runner.can_run_graph(batch)
        ran = self.target.forward_batch_generation(batch, is_verify=True, prepared_for_graph=prepared)
        dev.current.wait_stream(side)
        self.draft_extend(batch)
        dev.kernel(gf.OVERHEAD_MS)
        res = gf.Result([2] * len(batch.reqs))
        res.can_run_cuda_graph = ran
        return res
