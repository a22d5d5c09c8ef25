"""Instrumentor and hook life cycle against fake SGLang-shaped classes (sleeps on an injected clock)."""

from __future__ import annotations

import logging

import pytest

import fakes
from sglang_ctxprof.views.profile import summarize
from sglang_ctxprof import api
from sglang_ctxprof.collect import hooks
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.clocks import CpuClock
from sglang_ctxprof.collect.instrumentor import CtxProfInstrumentor, is_wrapper
from sglang_ctxprof.testing.session import instrumented

M = "fakes"
TARGETS = (
    Target(f"{M}.Scheduler.get_internal_state", "control", group="control"),
    Target(f"{M}.Scheduler.run_batch", "run_batch"),
    Target(f"{M}.Scheduler.process_batch_result", "process_batch_result"),
    Target(f"{M}.TargetWorker.forward_batch_generation", "verify"),
    Target(f"{M}.Worker.draft", "draft"),
    Target(f"{M}.Worker.draft_extend", "draft_extend"),
    Target(f"{M}.Attn.forward", "attn"),
    Target(f"{M}.MoE.forward", "moe"),
)
ORIGINALS = {t.path: fakes.__dict__[t.path.split(".")[1]].__dict__[t.path.split(".")[2]] for t in TARGETS}


@pytest.fixture
def prof():
    with instrumented(TARGETS) as session:
        assert set(session.instrumentor.report.values()) == {"ok"}
        yield session.profiler


def run_steps(n=3, sleep=0.002, reqs=None):
    sched = fakes.Scheduler(fakes.Worker(sleep))
    reqs = reqs or [fakes.Req("a", 100)]
    for _ in range(n):
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)
        assert sched.process_batch_result(batch, res) == "processed"
    return sched, reqs


def test_instrument_marks_and_uninstrument_restores():
    inst = CtxProfInstrumentor()
    inst.instrument(TARGETS, hooks.HOOKS)
    assert is_wrapper(fakes.Scheduler.run_batch) and fakes.Scheduler.run_batch.__wrapped__ is ORIGINALS[f"{M}.Scheduler.run_batch"]
    again = inst.instrument(TARGETS, hooks.HOOKS)  # idempotent: a second call changes nothing
    assert again[f"{M}.Scheduler.run_batch"] == "ok"
    assert not is_wrapper(fakes.Scheduler.run_batch.__wrapped__)
    inst.uninstrument()
    for t in TARGETS:
        owner = getattr(fakes, t.path.split(".")[1])
        assert owner.__dict__[t.path.split(".")[2]] is ORIGINALS[t.path]


def test_missing_and_incompatible_targets_are_reported_not_fatal(caplog):
    inst = CtxProfInstrumentor()
    with caplog.at_level(logging.WARNING):
        rep = inst.instrument([Target(f"{M}.Scheduler.no_such_method", "draft"),
                               Target(f"{M}.Scheduler.run_batch", "run_batch")], hooks.HOOKS,
                              signatures={f"{M}.Scheduler.run_batch": ("self", "wrong_name")})
    assert rep[f"{M}.Scheduler.no_such_method"].startswith("missing")
    assert rep[f"{M}.Scheduler.run_batch"].startswith("incompatible")
    assert "not found" in caplog.text and "unexpected signature" in caplog.text
    assert not is_wrapper(fakes.Scheduler.run_batch)
    inst.uninstrument()


def test_a_target_whose_module_fails_to_import_is_reported_missing_not_raised(tmp_path, monkeypatch):
    """A module of SGLang's that raises on import (a kernel library probing its device, say) is a
    missing target, like one that is not there: the rest is hooked and the server starts."""
    (tmp_path / "ctxprof_broken_mod.py").write_text("raise RuntimeError('no device for this kernel library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    inst = CtxProfInstrumentor()
    rep = inst.instrument([Target("ctxprof_broken_mod.Thing.run", "draft", required=False),
                           Target(f"{M}.Scheduler.run_batch", "run_batch")], hooks.HOOKS)
    assert rep["ctxprof_broken_mod.Thing.run"] == "missing: RuntimeError: no device for this kernel library"
    assert rep[f"{M}.Scheduler.run_batch"] == "ok" and is_wrapper(fakes.Scheduler.run_batch)
    inst.uninstrument()
    assert not is_wrapper(fakes.Scheduler.run_batch)


def test_step_record_phases_add_up_and_timing_is_exact(monkeypatch):
    now = [10**12]  # the fakes "sleep" by advancing the profiler's clock: exact, no tolerance
    monkeypatch.setattr(fakes.time, "sleep", lambda s: now.__setitem__(0, now[0] + round(s * 1e9)))
    with instrumented(TARGETS, clock=CpuClock(lambda: now[0])) as session:
        run_steps(3, sleep=0.01)
        body = summarize(session.profiler.state()["state"])
    (b,) = body["buckets"]
    ph = b["phases"]
    assert b["steps"] == 3 and b["accepted_per_step"] == 3 and b["accepted"] == 9
    # draft, draft_extend 10 ms; verify = attn 10 + moe 10 + 10 rest
    for name, want in (("draft", 10), ("draft_extend", 10), ("verify_attn", 10), ("verify_moe", 10),
                       ("verify_rest", 10), ("verify", 30), ("step", 50)):
        assert ph[name]["mean_ms"] == pytest.approx(want, abs=1e-9), (name, ph[name])
    leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
    assert leaves == pytest.approx(ph["step"]["total_ms"])
    assert ph["overhead"]["mean_ms"] == pytest.approx(0.0, abs=1e-9)


def test_accounting_and_overshoot_rows(prof):
    a, b = fakes.Req("a", 100), fakes.Req("b", 3000)
    b.max_new = 4  # b finishes after one step (1 + 3 tokens); later rows are overshoot
    run_steps(3, reqs=[a, b])
    ra = prof.recorder.with_aggregator(lambda ag: ag.requests.get("a"))
    rb = prof.recorder.with_aggregator(lambda ag: ag.requests.get("b"))
    assert ra["steps"] == a.spec_verify_ct == 3 and 1 + ra["committed"] == len(a.output_ids)
    assert rb["steps"] == b.spec_verify_ct == 1 and rb["finished"] is True
    assert [r["ctx_len"] for r in ra["step_rows"]] == [101, 104, 107]


def test_our_failure_never_reaches_the_host(prof, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("bug in ctxprof")

    monkeypatch.setattr(prof, "begin_step", boom)
    sched, reqs = run_steps(2)
    assert reqs[0].spec_verify_ct == 2  # SGLang's work happened exactly as without us
    assert prof.guard.status() == {"components": {"hooks": "RuntimeError: bug in ctxprof"}}


def test_host_exception_passes_through_unchanged(prof):
    class HostError(Exception):
        pass

    sched = fakes.Scheduler(fakes.Worker())

    def broken(batch):
        raise HostError("sglang failed")

    sched.model_worker.forward_batch_generation = broken
    with pytest.raises(HostError, match="sglang failed"):
        sched.run_batch(fakes.Batch([fakes.Req("x", 5)]))
    assert prof.guard.status() is None  # not our failure


def test_control_passthrough_and_runtime_disable(prof, monkeypatch):
    sched = fakes.Scheduler(fakes.Worker())
    assert sched.get_internal_state(object()) == {"internal": True}
    monkeypatch.setattr("sglang_ctxprof.collect.adapter.make_control_reply", lambda payload: payload)
    from sglang_ctxprof.control import protocol as control

    class Req:
        rid = control.encode("status")

    out = sched.get_internal_state(Req())
    assert out["ctx_profile"]["status"]["enabled"] is True
    Req.rid = control.encode("disable")
    sched.get_internal_state(Req())
    assert not is_wrapper(fakes.Scheduler.run_batch) and is_wrapper(fakes.Scheduler.get_internal_state)
    Req.rid = "__ctx_profile__:{not json"
    assert "error" in sched.get_internal_state(Req())["ctx_profile"]


def test_runtime_disable_ends_the_drain_thread_and_enable_brings_it_back(prof):
    """Off costs nothing: ``disable`` also ends the recorder's drain thread (once it has drained
    what was queued), and ``enable`` starts it again for a scheduler already seen; the status says
    which (``drain``)."""
    session = hooks.SESSION
    run_steps(2)
    thread = prof.recorder._thread
    assert thread is not None and prof.status()["drain"] == "running"
    session.disable()
    thread.join(60)
    assert not thread.is_alive() and prof.status()["drain"] == "stopped"
    assert prof.aggregator.records == 2  # what was queued was drained first
    session.enable()
    assert prof.status()["drain"] == "running"
    run_steps(1)
    prof.recorder.flush()
    assert prof.aggregator.records == 3


def test_public_phase_api_is_noop_without_a_session():
    assert hooks.SESSION is None
    assert api.phase("draft") is api._NULL  # the shared no-op: no allocation, no clock read
    with pytest.raises(ValueError, match="unknown phase"):
        api.phase("nonsense")


def test_nothing_at_all_is_recorded_after_uninstrument():
    with instrumented(TARGETS) as session:
        p = session.profiler
        run_steps(2)
        p.recorder.flush()
        submitted, records = p.recorder.submitted, p.aggregator.records
        assert submitted == records == 2 and p.recorder._thread is not None
    # the exact mirror: every original back, the handle cleared, the drain thread stopped
    assert hooks.SESSION is None and session.profiler is None
    for t in TARGETS:
        owner = fakes.__dict__[t.path.split(".")[1]]
        assert owner.__dict__[t.path.split(".")[2]] is ORIGINALS[t.path], t.path
    assert p.recorder._thread is None
    sched, _ = run_steps(2)
    assert not is_wrapper(sched.model_worker.forward_batch_generation)
    assert api.phase("draft") is api._NULL
    assert p.recorder.submitted == submitted and p.aggregator.records == records


def test_phase_api_is_guarded_and_stops_after_a_failure(prof):
    sched = fakes.Scheduler(fakes.Worker())
    b = prof.begin_step(sched, fakes.Batch([fakes.Req("a", 10)]))
    assert b is not None and api.phase("draft") is not api._NULL

    def broken():
        raise RuntimeError("clock broke")

    prof.clock.mark = broken
    with api.phase("draft"):  # our clock fails: the custom worker's block still runs, nothing raises
        ran = True
    assert ran and "clock broke" in prof.guard.status()["components"]["hooks"]
    assert api.phase("verify") is api._NULL  # hooks disabled after our failure: no more recording
    prof.tls.step = None


def test_overlap_order_keys_results_by_forward_iter(prof):
    """Overlap scheduler: run_batch(N+1) runs before process_batch_result(N); records never mix.

    (SGLang 0.5.23 runs speculative decoding without overlap on the CPU, so the real-server tests
    cannot exercise this order; this test reproduces it.)"""
    sched = fakes.Scheduler(fakes.Worker(0.001))
    a = fakes.Req("a", 100)
    prev = None
    for _ in range(4):
        batch = fakes.Batch([a])
        res = sched.run_batch(batch)
        if prev is not None:
            sched.process_batch_result(*prev)
        prev = (batch, res)
    sched.process_batch_result(*prev)
    r = prof.recorder.with_aggregator(lambda ag: ag.requests.get("a"))
    assert r["steps"] == a.spec_verify_ct == 4
    assert [row["step_id"] for row in r["step_rows"]] == [1, 2, 3, 4]
    assert [row["ctx_len"] for row in r["step_rows"]] == [101, 104, 107, 110]
    assert not prof.pending


def test_runtime_disable_ends_the_log_summary_thread_and_enable_brings_it_back(tmp_path):
    """Off runs no thread of ours: the exporters' log summary thread ends too, and comes back."""
    import threading

    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import exporters

    def summary_threads():
        return [t for t in threading.enumerate() if t.name == "ctxprof-log-summary" and t.is_alive()]

    cfg = CtxProfConfig.from_env({"SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": str(tmp_path / "l"),
                                  "SGLANG_CTXPROF_LOG_SUMMARY_S": "60"})
    with instrumented(TARGETS, cfg, exporters=exporters.install) as session:
        assert len(summary_threads()) == 1
        session.disable()
        assert summary_threads() == []
        session.enable()
        assert len(summary_threads()) == 1
    assert summary_threads() == []


def test_hooks_that_fail_from_the_first_step_on_still_bind_the_exporters(prof):
    """An SGLang whose first step breaks our hooks (an upgrade): the profiler still binds to the
    scheduler at that step, so the exporters (the live degraded gauge) exist and report it."""
    prof.guard.fail("hooks", RuntimeError("hooks broken from the start"))
    assert not prof.recorder.running()
    sched, reqs = run_steps(1)
    assert reqs[0].spec_verify_ct == 1
    assert prof.guard.status()["components"] == {"hooks": "RuntimeError: hooks broken from the start"}
    assert prof.scheduler is sched and prof.recorder.running()  # bound: the drain and the exporters' facts


def test_a_request_that_finished_while_profiling_was_off_ends_when_profiling_starts_again():
    """``disable``, a request finishes, ``enable``: SGLang no longer holds it, so it ends (partial),
    where it used to stay unfinished until evicted; one SGLang still runs stays open."""
    from types import SimpleNamespace

    with instrumented(TARGETS) as session:
        p = session.profiler
        sched = fakes.Scheduler(fakes.Worker(0.001))
        a, b = fakes.Req("a", 100), fakes.Req("b", 100)
        for _ in range(2):
            batch = fakes.Batch([a, b])
            sched.process_batch_result(batch, sched.run_batch(batch))
        session.disable()
        a.max_new = 1  # a finished while nothing was recorded; b still runs (SGLang holds it)
        sched.waiting_queue, sched.running_batch, sched.last_batch, sched.chunked_req = [], SimpleNamespace(
            reqs=[a, b]), None, None
        session.enable()
        p.recorder.flush()
        ra, rb = (p.recorder.with_aggregator(lambda g, r=r: g.request(r)) for r in ("a", "b"))
        assert ra["finished"] and ra["partial"] and ra["steps"] == 2
        assert not rb["finished"] and rb["partial"]
