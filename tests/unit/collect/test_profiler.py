"""The per-batch hot path builds exactly the record the per-request walk built, walking the list once;
and the profiler measures and states its own cost.

``old_host`` below is the record building as it was before the per-batch arrays (a
``req_snapshot`` per request before SGLang processes the result, another after, ``finished()`` per
request): every scenario runs the new profiler and the old algorithm on the same fake batches and
compares the records field by field.  The fake request mirrors SGLang's ``Req`` where the record
relies on it (``output_ids`` extended in place, ``finished_reason``/``finished_len`` set together
once, ``spec_verify_ct`` counted only on rows SGLang processes; overlap overshoot rows skipped).
"""

from __future__ import annotations

from array import array
from collections import Counter

import pytest

import fakes
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.clocks import CudaEventClock
from sglang_ctxprof.collect.cost import SAMPLE_EVERY
from sglang_ctxprof.collect.profiler import Profiler
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.model.names import KIND_DECODE
from sglang_ctxprof.testing.fake_cuda import FakeDevice
from sglang_ctxprof.testing.session import Capture, instrumented
from sglang_ctxprof.views.profile import Profile
from sglang_ctxprof.views.text import cost_line, render

FIELDS = ("step_id", "kind", "algorithm", "rank", "rids", "ctx_lens", "accepted", "committed", "finished",
          "draft_tokens", "trace_parents", "timing")


# ---- the record building as it was (per-request snapshots before and after) ----------------------------
def old_snapshot(req):
    out = req.output_ids
    flen = getattr(req, "finished_len", None)
    emitted = len(out) if flen is None else min(len(out), flen)
    return req.rid, len(req.origin_input_ids) + len(out), int(getattr(req, "spec_verify_ct", 0)), emitted


def old_finished(req):
    try:
        return bool(req.finished())
    except Exception:  # noqa: BLE001
        return False


def old_accept_lens(result, n):
    al = getattr(result, "accept_lens", None)
    if al is None:
        return [1] * n
    if getattr(al, "is_cpu", True):
        return [int(x) for x in al.tolist()]
    return [0] * n


def old_host(kind, algorithm, pre, reqs, result, done=None):
    """``done``: per request, finished or retracted before SGLang processed the result (SGLang skips
    those rows of a non-speculative decode); a prefill row commits the token a re-prefill appends."""
    if len(pre) != len(reqs):
        return None
    rids, ctx, acc, com, fin = [], [], [], [], []
    if kind == KIND_DECODE:
        accepts = old_accept_lens(result, len(reqs))
        spec = algorithm != "NONE"
        for i, req in enumerate(reqs):
            rid, ctx_len, vct, emitted = pre[i]
            _, _, vct2, emitted2 = old_snapshot(req)
            if spec and vct2 == vct:
                continue
            if not spec and done and done[i]:
                continue
            rids.append(rid)
            ctx.append(ctx_len)
            acc.append(accepts[i] if i < len(accepts) else 0)
            com.append(max(0, emitted2 - emitted))
            fin.append(old_finished(req))
    else:
        for i, req in enumerate(reqs):
            rid, ctx_len, _, emitted = pre[i]
            rids += [rid]
            ctx += [ctx_len]
            acc += [0]
            com += [max(0, old_snapshot(req)[3] - emitted) if emitted else 0]
            fin += [old_finished(req)]
    if not rids:
        return None
    return dict(kind=kind, algorithm=algorithm, rids=tuple(rids), ctx_lens=tuple(ctx), accepted=tuple(acc),
                committed=tuple(com), finished=tuple(fin), trace_parents=(),
                draft_tokens=(result.speculative_num_draft_tokens if kind == KIND_DECODE else 0))


# ---- an SGLang-shaped request and result processing ---------------------------------------------------
class SReq:
    def __init__(self, rid, prompt, max_new=10**9, stop_at=None):
        self.rid = rid
        self.origin_input_ids = array("q", [0] * prompt)
        self.output_ids = array("q", [1])  # one token: a prefill of it counts as a re-prefill
        self.spec_verify_ct = 0
        self.finished_reason = None
        self.finished_len = None
        self.is_retracted = False
        self.max_new = max_new
        self.stop_at = stop_at  # a stop string ending at this many output tokens
        self.time_stats = None

    def finished(self):
        return self.finished_reason is not None


class DeviceTensor:
    is_cpu = False

    def tolist(self):
        raise AssertionError("a device tensor is never read")


def sglang_process(batch, result, spec=True):
    """What SGLang's process_batch_result does to the requests (decode and prefill)."""
    al = getattr(result, "accept_lens", None)
    vals = al.vals if isinstance(al, fakes.Tensor) else None
    for i, r in enumerate(batch.reqs):
        if r.finished() or r.is_retracted:
            continue  # overlap overshoot / retracted: not counted
        n = vals[i] if vals is not None and i < len(vals) else 1
        if batch.forward_mode.is_decode() and spec:
            r.spec_verify_ct += 1
        r.output_ids.extend([7] * n)
        if r.stop_at is not None and len(r.output_ids) >= r.stop_at:
            r.finished_len, r.finished_reason = r.stop_at, "stop"
        elif len(r.output_ids) >= r.max_new:
            r.finished_reason = "length"


class Result:
    speculative_num_draft_tokens = 4

    def __init__(self, accept=None, device=False):
        if device:
            self.accept_lens = DeviceTensor()
        elif accept is not None:
            self.accept_lens = fakes.Tensor(accept)


class Harness:
    """Drives the profiler's step life cycle by hand (overlap order included) next to ``old_host``."""

    def __init__(self, algorithm="EAGLE"):
        self.p = Profiler(CtxProfConfig())
        self.sched = fakes.Scheduler(fakes.Worker())
        self.sched.server_args.speculative_algorithm = algorithm if algorithm != "NONE" else None
        self.cap = Capture(self.p)
        self.expected = []
        self.spec = algorithm != "NONE"

    def launch(self, reqs, mode="DECODE"):
        batch = fakes.Batch(list(reqs), mode)
        b = self.p.begin_step(self.sched, batch)
        self.sched.forward_ct += 1
        batch.forward_iter = self.sched.forward_ct
        b.span = (0, 1_000_000)
        self.p.end_step(b, batch)
        return batch

    def process(self, batch, result):
        pre = [old_snapshot(r) for r in batch.reqs]
        done = [r.finished() or r.is_retracted for r in batch.reqs]
        b = self.p.before_result(batch)
        sglang_process(batch, result, self.spec)
        self.p.after_result(b, batch, result)
        old = old_host(b.kind, self.p.serving.algorithm, pre, batch.reqs, result, done)
        if old is not None:
            self.expected.append(dict(old, step_id=batch.forward_iter, rank=self.p.serving.rank, timing="cpu"))

    def check(self):
        got = self.cap.records()
        self.p.recorder.stop()
        assert [{f: getattr(r, f) for f in FIELDS} for r in got] == self.expected
        return got


def test_spec_decode_record_is_identical_with_overshoot_stops_and_composition_changes():
    h = Harness("EAGLE")
    a, b, c = SReq("a", 2047), SReq("b", 100, max_new=5), SReq("c", 3000, stop_at=5)
    d, e = SReq("d", 50), SReq("e", 9)
    h.process(h.launch([a, b, c], "EXTEND"), Result())
    batches = [[a, b, c], [a, b, c], [a, b, c], [a, d], [a, d], [a, d, e]]
    accepts = [[3, 4, 4], [2, 2, 1], [1, 1, 1], [4, 2], [1, 3], [2, 2]]
    nxt = h.launch(batches[0])
    for i in range(len(batches)):  # overlap: step i+1 launches before step i's result is processed
        cur = nxt
        if i + 1 == 3:  # d is prefilled before it joins
            h.process(h.launch([d], "EXTEND"), Result())
        nxt = h.launch(batches[i + 1]) if i + 1 < len(batches) else None
        h.process(cur, Result(accepts[i]))
    h.process(h.launch([a, d, e]), Result([3]))  # accept_lens shorter than the batch: 0 for the rest
    h.process(h.launch([a, d, e]), Result(device=True))  # never read a device tensor: 0
    got = h.check()
    first = got[1]  # the first decode step: b finishes by length, c by a stop string (capped at 5)
    assert first.accepted == (3, 4, 4) and first.committed == (3, 4, 3) and first.finished == (False, True, True)
    assert got[2].rids == ("a",)  # the next step's b and c rows are overlap overshoot: left out
    assert c.finished_len == 5 and b.finished_reason == "length"


def test_non_speculative_decode_and_prefill_records_are_identical():
    h = Harness("NONE")
    a, b = SReq("a", 64, max_new=3), SReq("b", 128)
    h.process(h.launch([a, b], "EXTEND"), Result())
    for _ in range(3):
        h.process(h.launch([a, b]), Result())
    got = h.check()
    # a finished at the first decode step; under overlap it rides the next ones, which SGLang skips
    assert [r.rids for r in got[1:]] == [("a", "b"), ("b",), ("b",)]


def test_a_retracted_request_reprefill_commits_its_token_and_skips_its_overshoot_row():
    h = Harness("NONE")
    a, b = SReq("a", 64), SReq("b", 32)
    a.output_ids, b.output_ids = array("q"), array("q")  # a fresh request has no output before prefill
    h.process(h.launch([a, b], "EXTEND"), Result())
    h.process(h.launch([a, b]), Result())
    nxt = h.launch([a, b])  # overlap: launched, then SGLang retracts a before processing it
    a.is_retracted = True
    h.process(nxt, Result())
    a.is_retracted = False  # prepare_for_extend of the re-prefill
    h.process(h.launch([a], "EXTEND"), Result())
    got = h.check()
    assert got[0].committed == (0, 0)  # the first prefill's token is the 1 of 1 + committed
    assert got[2].rids == ("b",)
    assert got[3].kind == "prefill" and got[3].committed == (1,) and got[3].ctx_lens == (64 + 2,)


def test_requests_without_finished_reason_fall_back_to_finished():
    h = Harness("EAGLE")
    reqs = [fakes.Req("x", 10), fakes.Req("y", 20)]
    reqs[1].max_new = 4
    for _ in range(3):
        batch = h.launch(reqs)
        pre = [old_snapshot(r) for r in batch.reqs]
        bld = h.p.before_result(batch)
        h.sched.process_batch_result(batch, fakes.Result([3, 3]))
        h.p.after_result(bld, batch, fakes.Result([3, 3]))
        old = old_host(KIND_DECODE, "EAGLE", pre, batch.reqs, fakes.Result([3, 3]))
        h.expected.append(dict(old, step_id=batch.forward_iter, rank=h.p.serving.rank, timing="cpu"))
    h.check()


def test_an_unchanged_batch_yields_the_same_rids_tuple():
    h = Harness("EAGLE")
    reqs = [SReq(f"r{i}", 100) for i in range(4)]
    for _ in range(3):
        h.process(h.launch(reqs), Result([2] * 4))
    h.process(h.launch(reqs[:3]), Result([2] * 3))
    got = h.check()
    assert got[0].rids is got[1].rids is got[2].rids and got[3].rids == ("r0", "r1", "r2")


# ---- the request list is walked once per step ----------------------------------------------------------
READS: Counter = Counter()


class CountingReq(SReq):
    def __getattribute__(self, name):
        READS[name] += 1
        return object.__getattribute__(self, name)


class CountingList(list):
    iterations = 0

    def __iter__(self):
        CountingList.iterations += 1
        return super().__iter__()


@pytest.mark.parametrize("n", [256])
def test_record_building_walks_the_request_list_once_per_step(n):
    h = Harness("EAGLE")
    reqs = [CountingReq(f"r{i}", 2048) for i in range(n)]
    for step in range(3):
        batch = h.launch(reqs)
        batch.reqs = CountingList(batch.reqs)
        READS.clear()
        CountingList.iterations = 0
        bld = h.p.before_result(batch)
        before = dict(READS)
        for r in list.__iter__(batch.reqs):  # SGLang's own processing, not counted against us
            r.spec_verify_ct = object.__getattribute__(r, "spec_verify_ct") + 1
            object.__getattribute__(r, "output_ids").extend((7, 7))
        READS.clear()
        h.p.after_result(bld, batch, Result([2] * n))
        after = dict(READS)
        READS.clear()
        h.p.recorder.flush()
        drain = dict(READS)
        assert CountingList.iterations == 1  # the list itself: walked once (into a tuple)
        assert before == {"output_ids": n, "spec_verify_ct": n}  # one read per attribute per request
        assert after == {"spec_verify_ct": n, "finished_reason": n}
        # fixed per request while it runs: read on the drain thread, once per batch composition
        assert drain == ({"rid": n, "origin_input_ids": n} if step == 0 else {})
    got = h.cap.records()
    h.p.recorder.stop()
    assert [r.batch_size for r in got] == [n] * 3 and got[-1].committed == (2,) * n
    assert got[0].ctx_lens == (2049,) * n and got[2].ctx_lens == (2053,) * n


# ---- the profiler states its own cost --------------------------------------------------------------------
M = "fakes"
TARGETS = tuple(Target(f"{M}.{x}", h) for x, h in (
    ("Scheduler.run_batch", "run_batch"), ("Scheduler.process_batch_result", "process_batch_result"),
    ("TargetWorker.forward_batch_generation", "verify"), ("Worker.draft", "draft"),
    ("Worker.draft_extend", "draft_extend"), ("Attn.forward", "attn"), ("MoE.forward", "moe")))


def _steps(sched, reqs, n, between=lambda: None):
    for _ in range(n):
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)
        between()
        sched.process_batch_result(batch, res)


def test_cost_is_timed_on_sampled_steps_and_shown_in_status_and_text():
    with instrumented(TARGETS) as session:
        p = session.profiler
        _steps(fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100), fakes.Req("b", 200)], 3 * SAMPLE_EVERY)
        p.recorder.flush()
        cost = p.status()["cost"]
        assert set(cost) == {"sched_us_per_step", "sampled_steps", "drain_us_per_record", "events_per_step",
                             "step_share", "drain_share", "total_share", "drain_wakes_per_record",
                             "drain_pauses_per_record"}
        assert cost["drain_wakes_per_record"] == p.cost.wakes / p.cost.drain_records
        assert cost["drain_pauses_per_record"] == p.cost.pauses / p.cost.drain_records
        assert cost["sampled_steps"] == 3 and cost["sched_us_per_step"] > 0 and cost["step_share"] > 0
        assert p.cost.drain_records == p.recorder.submitted == 3 * SAMPLE_EVERY
        assert cost["drain_us_per_record"] > 0 and cost["events_per_step"] is None  # CPU clock: no events
        # the drain thread's work per record, over the same mean step: it shares the scheduler's GIL
        step_us = p.cost.step_ms * 1e3 / p.cost.step_n
        assert cost["drain_share"] == pytest.approx(cost["drain_us_per_record"] / step_us)
        assert cost["total_share"] == pytest.approx(cost["step_share"] + cost["drain_share"])
    line = cost_line([{"status": {"cost": cost}}, {"error": "rank 1 did not answer"}])
    assert line.startswith(f"profiler cost: {cost['total_share']:.1%} of the step in the scheduler's process: "
                           f"{cost['sched_us_per_step']:.0f} µs/step on the scheduler thread "
                           f"({cost['step_share']:.1%}), drain thread {cost['drain_us_per_record']:.0f} µs/record "
                           f"({cost['drain_share']:.1%})")
    text = render(Profile(ranks=({"status": {"cost": cost}},)))
    assert line in text.splitlines()
    assert cost_line([{"status": {"cost": dict(cost, sampled_steps=0)}}]) == ""  # nothing timed yet


def test_gpu_events_per_step_are_counted():
    with instrumented(TARGETS) as session:
        p = session.profiler
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        _steps(sched, reqs, 1)
        dev = FakeDevice()
        p.clock = CudaEventClock(event_factory=lambda: dev.Event(enable_timing=True))
        _steps(sched, reqs, SAMPLE_EVERY, between=dev.run)
        # step span + draft, verify, attention, MoE, draft_extend: two events each
        assert p.status()["cost"]["events_per_step"] == 12 and dev.syncs == 0


def test_disabling_forgets_the_steps_parked_for_their_device_times():
    """A step whose device events were not complete at its result is parked; switching profiling
    off forgets it (its events go back to the clock), so it never lands in the next period."""
    with instrumented(TARGETS) as session:
        p = session.profiler
        cap = Capture(p)
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        _steps(sched, reqs, 1)
        dev = FakeDevice()
        p.clock = clock = CudaEventClock(event_factory=lambda: dev.Event(enable_timing=True))
        _steps(sched, reqs, 3)  # the device is behind: steps 2-4 wait for their events
        assert len(p.parked) == 3
        created = clock.created
        session.disable()
        assert len(p.parked) == 0 and p.status()["parked"] == 0
        session.enable()
        dev.run()  # the forgotten steps' events complete now
        _steps(sched, reqs, 2, between=dev.run)
        assert [r.step_id for r in cap.records()] == [1, 5, 6]
        assert clock.created == created  # the new steps reuse the forgotten steps' events


def test_the_exporters_read_a_finished_request_under_the_aggregators_lock():
    """The sinks run on the drain thread outside the aggregator's lock, while a read's catch-up on
    the scheduler thread may append or shed rows: the history read the exporters make is taken
    under that lock (it never sees rows half appended or half shed), without catching up."""
    with instrumented(TARGETS) as session:
        p = session.profiler
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        _steps(sched, reqs, 2)
        p.recorder.flush()
        held = []
        real = p.aggregator.request

        def finished_request(rid, stamp, lazy=False, with_steps=True):  # "a" runs on: read it as it is
            held.append(p.recorder._lock.locked())
            return real(rid, lazy, with_steps)

        p.aggregator.finished_request = finished_request
        p.recorder.stop()  # no drain thread: what is queued stays queued
        _steps(sched, reqs, 1)
        queued = len(p.recorder._q)
        assert p.export_history("a", True, 0)["steps"] == 2
        assert held == [True] and len(p.recorder._q) == queued > 0  # under the lock, no catch-up


def test_a_traced_prefill_reads_its_trace_contexts_on_the_drain_not_in_the_step(monkeypatch):
    """With SGLang tracing (``--enable-trace``), each request of a prefill carries the client's trace
    context; building its ``traceparent`` costs ~2 us a request (an OTel propagator): the step reads
    none of them, the record's build (the drain thread) reads each request's."""
    from types import SimpleNamespace

    from sglang_ctxprof.collect import adapter

    calls = []

    def parent(req):  # as adapter's: "" for a request SGLang does not trace
        calls.append(req.rid)
        return f"00-{req.rid:0>32}-{'1' * 16}-01" if adapter.req_tracing(req) else ""

    monkeypatch.setattr(adapter, "req_trace_parent", parent)
    h = Harness("EAGLE")
    reqs = [SReq(f"{i}", 100) for i in range(8)]
    for r in reqs[1:]:  # the first came before tracing was switched on (/set_trace_level): each says
        r.time_stats = SimpleNamespace(trace_ctx=SimpleNamespace(tracing_enable=True))
    batch = h.launch(reqs, "EXTEND")
    h.p.recorder.stop()  # no drain thread: the build runs when records() flushes, after the assert below
    b = h.p.before_result(batch)
    sglang_process(batch, Result(), True)
    h.p.after_result(b, batch, Result())
    assert calls == []  # nothing per request in the step
    (rec,) = h.cap.records()
    assert calls == [r.rid for r in reqs] and rec.trace_parents == tuple(map(parent, reqs))
    assert rec.trace_parents[0] == "" and all(rec.trace_parents[1:])
    h.p.recorder.stop()
    plain = Harness("EAGLE")  # not traced: no contexts at all
    batch = plain.launch([SReq("p", 100)], "EXTEND")
    b = plain.p.before_result(batch)
    sglang_process(batch, Result(), True)
    plain.p.after_result(b, batch, Result())
    assert plain.cap.records()[0].trace_parents == ()
    plain.p.recorder.stop()


def test_a_plain_reset_keeps_the_step_launched_before_it():
    """Under overlap a step runs before the previous one's result: a plain reset keeps it, so the
    requests that finish at it still end (and are exported); a clock change drops it (no step mixes
    two clocks)."""
    with instrumented(TARGETS) as session:
        p = session.profiler
        cap = Capture(p)
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        _steps(sched, reqs, 1)
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)  # launched ...
        p.reset()  # ... a plain reset ...
        sched.process_batch_result(batch, res)  # ... its result
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)
        p.reset(clock="thread")
        sched.process_batch_result(batch, res)
        p.recorder.flush()
        assert [r.step_id for r in cap.records()] == [1, 2]


def test_a_clock_change_that_drops_a_launched_step_leaves_a_loss_mark():
    """The step a clock change drops ran all the same: the sinks that measure between steps learn it
    (no host gap across it, the capture's trigger), and the requests running then miss a step."""
    with instrumented(TARGETS) as session:
        p = session.profiler
        cap = Capture(p)
        marks: list[str] = []
        cap.lost = lambda: marks.append("lost")  # type: ignore[attr-defined]
        sched, reqs = fakes.Scheduler(fakes.Worker()), [fakes.Req("a", 100)]
        _steps(sched, reqs, 1)
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)
        p.reset()  # a plain reset drops nothing
        sched.process_batch_result(batch, res)
        p.recorder.flush()
        assert marks == []
        batch = fakes.Batch(reqs)
        res = sched.run_batch(batch)
        p.reset(clock="thread")  # drops the launched step
        sched.process_batch_result(batch, res)
        p.recorder.flush()
        assert marks == ["lost"]
        p.reset(clock="wall")  # nothing waiting: nothing lost
        p.recorder.flush()
        assert marks == ["lost"]


def test_requests_that_finished_just_before_a_reset_are_still_exported():
    """A reset catches the aggregator up and empties its history while the sinks, a few records
    behind, have not seen the finishing records yet: they read the retired history, let go of once
    they have seen the last record before the reset."""
    from sglang_ctxprof.model.records import RankId, StepRecord
    from sglang_ctxprof.views import exporters

    def rec(kind, fin, sid, rid="x"):
        return StepRecord(step_id=sid, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(50,),
                          accepted=(2,) if kind == KIND_DECODE else (0,), committed=(2,) if kind == KIND_DECODE else (0,),
                          finished=(fin,), draft_tokens=4, step_ms=1.0, t_start_ns=10**18 + sid * 10**8)

    cfg = CtxProfConfig.from_env({"SGLANG_CTXPROF_LOG": "json", "SGLANG_CTXPROF_LOG_FILE": "/dev/null"})
    with instrumented([], cfg, exporters=exporters.install) as session:
        p = session.profiler
        p.bind(fakes.Scheduler(fakes.Worker()))
        p.recorder.stop()  # no drain thread: the sinks run at flush
        for rid, sid in (("x", 1), ("y", 10)):  # two resets before the sinks catch up
            for r in (rec("prefill", False, sid, rid), rec(KIND_DECODE, False, sid + 1, rid),
                      rec(KIND_DECODE, True, sid + 2, rid)):
                p.recorder.submit(r)
            p.reset()
        assert len(p.aggregator.retired) == 2 and len(p.aggregator.requests) == 0
        p.recorder.flush()
        assert p.exporters.status()["requests_finished"] == 2
        assert not p.aggregator.retired


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_the_first_step_paces_the_drain_for_the_schedulers_device(device):
    """``bind`` fits the recorder's drain to SGLang's ``--device`` (``pacing.for_device``): whole looks
    every 80 ms on the CPU, paced slices at the steps' pace on an accelerator."""
    from sglang_ctxprof.collect.pacing import CPU_LOOK_S, CPU_SLICE_NS

    with instrumented(TARGETS) as session:
        rec = session.profiler.recorder
        _steps(fakes.Scheduler(fakes.Worker(), device=device), [fakes.Req("a", 100)], 2)
        rec.flush()
        cpu = device == "cpu"
        assert (rec.pacer.slice_ns == CPU_SLICE_NS, rec.looks.base == CPU_LOOK_S) == (cpu, cpu)
        assert session.profiler.aggregator.records == 2
