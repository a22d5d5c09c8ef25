"""The graph-timing rig the collect tests share: one profiler on the simulated device
(``gpu_fakes``) through the real hooks, session, CudaEventClock and GraphTimer, with the capture of
its records, a ``cleanup`` fixture that uninstruments, and a traffic driver."""

from __future__ import annotations

import pytest

import gpu_fakes as gf
from fakes import Batch, Req
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.clocks import CudaEventClock
from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory
from sglang_ctxprof.collect.session import HOOKS, CtxProfSession
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.testing.session import Capture

K = 4


def build(monkeypatch, *, external=True, use_graph=True, gate=True, fallback="off", device_sync=True, k=K,
          record_cost_ms=0.0, draft_graph=True, concurrent=False):
    dev = gf.reset(supports_external=external, record_cost_ms=record_cost_ms, concurrent=concurrent)
    targets = [Target(path, hook) for path, hook in gf.TARGETS_SPEC
               if (gate or hook != "overlap_gate") and hook in HOOKS]
    session = CtxProfSession(CtxProfConfig(), targets=targets)
    assert set(session.instrument().values()) == {"ok"}
    p = session.profiler
    CAPTURES[id(p)] = Capture(p)
    sched = gf.Scheduler(None, device_sync=device_sync)
    p.bind(sched)
    p.clock = CudaEventClock(event_factory=lambda: gf.DEV.Event(enable_timing=True))
    factory, reason = external_event_factory(dev.Event)
    p.graph = GraphTimer(factory, lambda: gf.DEV.is_current_stream_capturing(), sample_every=k,
                         fallback=fallback, reason=reason)
    sched.model_worker = gf.Worker(use_graph=use_graph, draft_graph=draft_graph)  # model init: capture
    return p, session, sched


CAPTURES: dict[int, Capture] = {}  # profiler id -> the test's record capture


def records(p):
    return CAPTURES[id(p)].records()


@pytest.fixture
def cleanup():
    made = []
    yield made
    for _, session in made:
        session.uninstrument()


def traffic(sched, n=13):
    reqs = [Req("a", 100), Req("b", 700)]
    sched.loop_overlap([Batch(reqs) for _ in range(n)])
