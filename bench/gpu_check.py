#!/usr/bin/env python3
"""GPU check of sglang-ctxprof's device timing (torch only: no SGLang, no network; < 5 minutes).

A small model with attention-like blocks (q.K^T, softmax, .V over a KV cache) and MoE-like blocks
(router, top-2 of E experts) is hooked by *our* code exactly as in SGLang: the real ``hooks``,
``Profiler``, ``CudaEventClock`` and ``GraphTimer``, wrapped onto the block classes by the real
``CtxProfInstrumentor``; a toy scheduler drives run_batch -> worker -> verify -> process_batch_result
(which waits on the step's ``copy_done`` event, as SGLang does).  It checks:

1. ``graph_vs_eager``: the attention / MoE times read from external events inside a CUDA graph
   agree with plain CUDA-event times of the same blocks run eagerly, within 5 % (with
   ``--eager-report-only`` both are reported and only the split is required: blocks of a few tens
   of µs run launch-bound eagerly, and their eager events hold launch gaps a graph has not);
2. ``overhead``: what a replay costs.  The plain graph that unsampled steps (and everything after
   ``disable``) replay must cost what a graph captured without the profiler costs (< 1 %); the
   timed copy that sampled steps replay is measured against it (µs per event node), together with
   the time and GPU memory the timed copies add at capture;
3. ``no_sync``: running steps with profiling adds no synchronizing call (Python-level counters on
   torch.cuda.synchronize / Event.synchronize / Stream.synchronize / Tensor.item|tolist|cpu, and the
   torch profiler's cuda*Synchronize count, profiling on vs off).

``--dry-run`` runs the same code paths on the simulated device ``sglang_ctxprof.testing.fake_cuda`` (CPU
only; it is what ``make test`` runs).  ``--out FILE`` writes the results as JSON.  Exit code 0 when
every check passes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.modules.setdefault("sglang", None)  # the kit runs without SGLang, as on the GPU machine

from sglang_ctxprof.collect.adapter import Target  # noqa: E402
from sglang_ctxprof.model.config import CtxProfConfig, GraphSettings  # noqa: E402
from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory  # noqa: E402
from sglang_ctxprof.collect.session import CtxProfSession  # noqa: E402
from sglang_ctxprof.testing.fake_scheduler import PATH as SCHED, FakeScheduler  # noqa: E402
from sglang_ctxprof.testing.session import Capture  # noqa: E402
from sglang_ctxprof.collect.clocks import CudaEventClock  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_devices import FakeDev, TorchDev  # noqa: E402

DEV = None  # set by main(): a TorchDev or a FakeDev


# ---- the model and a toy scheduler shaped like SGLang's ---------------------------------------------
class AttnBlock:
    def forward(self):
        DEV.attn(self)


class MoEBlock:
    def forward(self):
        DEV.moe(self)


class Model:
    def __init__(self, layers):
        self.layers = [(AttnBlock(), MoEBlock()) for _ in range(layers)]

    def forward(self):
        for a, m in self.layers:
            a.forward()
            m.forward()
            DEV.rest(a)


class Backend:
    """FullCudaGraphBackend's shape: two eager warm-ups, then capture; ``_graphs``/``_outputs`` by
    key; replay returns the captured output; owned by the target's TARGET_VERIFY runner."""

    def __init__(self):
        self._graphs, self._outputs = {}, {}
        self._cuda_graph_runner = NS(model_runner=NS(is_draft_worker=False),
                                     capture_forward_mode=NS(is_target_verify=lambda: True))

    @property
    def graphs(self):
        return self._graphs

    def capture_one(self, shape_key, forward_fn):
        for _ in range(2):
            forward_fn()
            DEV.synchronize()
        holder = {}
        with DEV.capture(holder):
            out = forward_fn()
        self._graphs[shape_key], self._outputs[shape_key] = holder["g"], out

    def replay(self, shape_key):
        self._graphs[shape_key].replay()
        return self._outputs[shape_key]

    def cleanup(self):
        for g in self._graphs.values():
            g.reset()
        self._graphs.clear()
        self._outputs.clear()


class Target_:
    def __init__(self, layers, use_graph):
        self.model, self.backend, self.use_graph = Model(layers), Backend(), use_graph
        if use_graph:
            self.backend.capture_one("bs", self.model.forward)

    def forward_batch_generation(self, batch, is_verify=False):
        if self.use_graph:
            self.backend.replay("bs")
        else:
            self.model.forward()


class Worker:
    def __init__(self, target):
        self.target = target

    def forward_batch_generation(self, batch):
        DEV.busy()
        self.target.forward_batch_generation(batch, is_verify=True)
        return Result()


def Req(rid):
    return NS(rid=rid, origin_input_ids=[0] * 64, output_ids=[1], spec_verify_ct=0, finished=lambda: False)


def Batch(reqs):
    return NS(reqs=reqs, forward_mode=NS(is_decode=lambda: True), forward_iter=0)


def Result():
    return NS(accept_lens=None)


M = __name__
TARGETS = [Target(f"{SCHED}.run_batch", "run_batch"), Target(f"{SCHED}.process_batch_result", "process_batch_result")] + [
    Target(f"{M}.{p}", h) for p, h in (
    ("Target_.forward_batch_generation", "verify"), ("AttnBlock.forward", "attn"), ("MoEBlock.forward", "moe"),
    ("Backend.capture_one", "graph_capture"), ("Backend.replay", "graph_replay"),
    ("Backend.cleanup", "graph_cleanup"))]


def profiled_run(layers, steps, use_graph, dry, step_ctx=None):
    """Steps through our hooks; returns (records, profiler)."""
    session = CtxProfSession(CtxProfConfig(graph=GraphSettings(sample_every=1)), targets=TARGETS)
    session.instrument()
    p = session.profiler
    cap = Capture(p)
    try:
        if dry:
            f, why = external_event_factory(DEV.Event)
            p.graph = GraphTimer(f, DEV.is_capturing, sample_every=1, reason=why)
        else:
            p.ensure_graph()
        sched = FakeScheduler(None, device="cpu" if dry else "cuda", dev=DEV)
        p.bind(sched)
        if dry:
            p.clock = CudaEventClock(event_factory=lambda: DEV.Event(enable_timing=True))
        sched.model_worker = Worker(Target_(layers, use_graph))
        reqs = [Req(f"r{i}") for i in range(4)]
        with step_ctx or contextlib.nullcontext():
            for _ in range(steps):
                b = Batch(reqs)
                sched.process_batch_result(b, sched.run_batch(b))
        return cap.records(), p
    finally:
        session.uninstrument()


def mean_phase(recs, name):
    vals = [r.phases_ms[name] for r in recs if name in r.phases_ms]
    return statistics.fmean(vals) if vals else None


def check_graph_vs_eager(layers, steps, dry, report_only=False):
    """``report_only``: the times are reported, not held to 5 % (blocks so small that the eager run is
    launch-bound: its events include launch gaps a graph does not have); the split must still be read."""
    eager, _ = profiled_run(layers, steps, use_graph=False, dry=dry)
    graph, p = profiled_run(layers, steps, use_graph=True, dry=dry)
    out = {"split_mode": p.graph.describe()["mode"] if p.graph else None, "report_only": report_only}
    ok = out["split_mode"] == "cuda_graph_events" and all(r.timing == "cuda_graph_events" for r in graph)
    for name in ("verify_attn", "verify_moe"):
        e, g = mean_phase(eager[2:], name), mean_phase(graph[2:], name)
        diff = abs(g - e) / e if (e and g is not None) else None
        out[name] = {"eager_ms": e, "graph_ms": g, "rel_diff": diff}
        ok = ok and g is not None and (report_only or (diff is not None and diff < 0.05))
    return ok, out


def _time_replays(g, n):
    s, e = DEV.Event(enable_timing=True), DEV.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        g.replay()
    e.record()
    DEV.synchronize()
    return s.elapsed_time(e) / n


def check_overhead(layers, dry, rounds=7, n=20):
    """Replay cost of the plain graph (unsampled steps, and everything after disable) and of the
    timed copy (sampled steps), against a graph captured with no profiler at all.  The sessions and
    their timers stay alive until the last replay: a graph holds no reference to its events."""
    from sglang_ctxprof.collect.adapter import timed_shape_key

    keep = []

    def capture(with_events):
        session = CtxProfSession(CtxProfConfig(), targets=TARGETS if with_events else [])
        session.instrument()
        p = session.profiler
        if with_events:
            if dry:
                p.graph = GraphTimer(external_event_factory(DEV.Event)[0], DEV.is_capturing)
            else:
                p.ensure_graph()
        keep.append((session, p))  # released after the replays below
        mem0 = DEV.memory()
        t0 = time.perf_counter()
        t = Target_(layers, use_graph=True)
        secs, mem = time.perf_counter() - t0, DEV.memory() - mem0
        session.uninstrument()  # hooks off: the graphs stay, the timer (p.graph) is still referenced
        return t.backend, (p.graph.events if p.graph else 0), secs, mem
    try:
        b_on, ev_on, secs_on, mem_on = capture(True)
        b_off, _, secs_off, mem_off = capture(False)
        plain, timed, bare = b_on.graphs["bs"], b_on.graphs.get(timed_shape_key("bs")), b_off.graphs["bs"]
        if timed is None:
            return False, {"error": "no timed copy was captured", "events_in_graph": ev_on}
        t_plain, t_timed, t_bare = [], [], []
        for _ in range(rounds):  # A B C A B C on the same device
            t_plain.append(_time_replays(plain, n))
            t_timed.append(_time_replays(timed, n))
            t_bare.append(_time_replays(bare, n))
        m_plain, m_timed, m_bare = (statistics.median(x) for x in (t_plain, t_timed, t_bare))
        rel_off = (m_plain - m_bare) / m_bare if m_bare else 0.0
        rel_on = (m_timed - m_bare) / m_bare if m_bare else 0.0
        per_node_us = (m_timed - m_bare) * 1e3 / ev_on if ev_on else None
        ok = ev_on > 0 and abs(rel_off) < 0.01
        return ok, {"replay_ms_no_profiler": m_bare, "replay_ms_plain_graph": m_plain,
                    "replay_ms_timed_copy": m_timed, "rel_diff": rel_off, "rel_diff_timed_copy": rel_on,
                    "us_per_event_node": per_node_us, "events_in_graph": ev_on,
                    "capture_s_with_timed_copy": secs_on, "capture_s_without_profiler": secs_off,
                    "capture_mem_bytes_with_timed_copy": mem_on, "capture_mem_bytes_without_profiler": mem_off}
    finally:
        keep.clear()


class SyncCounter:
    """Counts synchronizing calls inside windows: Python-level wrappers (GPU) or the fake's counter."""

    def __init__(self, dry):
        self.dry, self.py, self.counts, self.prof = dry, 0, {}, {}

    def patch(self):
        self.patches = []
        if self.dry:
            return
        import torch

        for obj, attr in ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                          (torch.cuda.Stream, "synchronize"), (torch.Tensor, "item"),
                          (torch.Tensor, "tolist"), (torch.Tensor, "cpu")):
            orig = getattr(obj, attr)

            def wrapped(*a, _orig=orig, **kw):
                self.py += 1
                return _orig(*a, **kw)
            setattr(obj, attr, wrapped)
            self.patches.append((obj, attr, orig))

    def unpatch(self):
        for obj, attr, orig in self.patches:
            setattr(obj, attr, orig)

    def now(self):
        return DEV.d.syncs if self.dry else self.py

    def window(self, label):
        counter = self

        @contextlib.contextmanager
        def cm():
            prof = None
            if not counter.dry:
                from torch.profiler import ProfilerActivity, profile

                prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                prof.__enter__()
            start = counter.now()
            try:
                yield
            finally:
                counter.counts[label] = counter.now() - start
                if prof is not None:
                    prof.__exit__(None, None, None)
                    counter.prof[label] = sum(ev.count for ev in prof.key_averages() if "Synchronize" in ev.key)
        return cm()


def check_no_sync(layers, steps, dry):
    c = SyncCounter(dry)
    c.patch()
    try:
        recs, _ = profiled_run(layers, steps, use_graph=True, dry=dry, step_ctx=c.window("on"))
        _unprofiled(layers, steps, step_ctx=c.window("off"))
    finally:
        c.unpatch()
    extra = c.counts["on"] - c.counts["off"]  # both include SGLang's own copy_done sync per step
    ok = extra == 0 and c.counts["off"] == steps and len(recs) == steps
    if c.prof:
        ok = ok and c.prof["on"] <= c.prof["off"]
    return ok, {"sync_calls_profiling_on": c.counts["on"], "sync_calls_profiling_off": c.counts["off"],
                "extra_sync_calls": extra, "torch_profiler_sync_calls": c.prof or None}


def _unprofiled(layers, steps, step_ctx):
    sched = FakeScheduler(Worker(Target_(layers, use_graph=True)), device="cuda", dev=DEV)
    reqs = [Req(f"r{i}") for i in range(4)]
    with step_ctx:
        for _ in range(steps):
            b = Batch(reqs)
            sched.process_batch_result(b, sched.run_batch(b))


def main(argv=None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="simulated device (CPU), same code paths")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ctx", type=int, default=32768, help="KV tokens per request (GPU run)")
    ap.add_argument("--eager-report-only", action="store_true",
                    help="report graph vs eager without the 5%% bar (launch-bound eager blocks)")
    ap.add_argument("--out", default=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "gpu_check.json"))
    a = ap.parse_args(argv)
    if a.layers < 1 or a.steps < 4 or a.ctx < 16:
        ap.error("need --layers >= 1, --steps >= 4, --ctx >= 16")
    if a.dry_run:
        DEV = FakeDev(record_cost_ms=0.002)  # a modelled 2 µs per in-graph event node
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; use --dry-run on a CPU machine", file=sys.stderr)
            return 2
        DEV = TorchDev(a.ctx, bs=8, heads=8, dim=128, hidden=2048, experts=16)
    t0 = time.time()
    results = {"device": DEV.name, "dry_run": a.dry_run, "checks": {}}
    ok_all = True
    eager_only = a.eager_report_only
    for name, fn in (("graph_vs_eager", lambda: check_graph_vs_eager(a.layers, a.steps, a.dry_run, eager_only)),
                     ("overhead", lambda: check_overhead(a.layers, a.dry_run)),
                     ("no_sync", lambda: check_no_sync(a.layers, a.steps, a.dry_run))):
        try:
            ok, detail = fn()
        except Exception as exc:  # noqa: BLE001 - report which check broke and go on
            ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
        ok_all &= ok
        results["checks"][name] = {"pass": ok, **detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail, default=str)}")
    results["seconds"] = round(time.time() - t0, 2)
    results["pass"] = ok_all
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=2, default=str))
    print(f"gpu_check: {'all checks passed' if ok_all else 'FAILED'} on {DEV.name} in {results['seconds']} s")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
