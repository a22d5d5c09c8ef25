"""Probe P10: our real hooks, Profiler, CudaEventClock and GraphTimer in SGLang's overlap loop.

A toy of ``Scheduler.event_loop_overlap`` (launch N+1 before processing N unless
``is_disable_overlap_for_batch``), shaped like SGLang 0.5.23: the forward runs on a forward stream,
``copy_done`` is recorded on a copy stream after ``copy_stream.wait_stream(forward_stream)``, and
``process_batch_result`` synchronizes on it (SGLang's own wait).  The target runner's backend
captures the verify graph (two warm-ups, then capture) and our hooks add its timed copy; an
EAGLE-shaped worker replays a draft graph, asks ``can_run_graph`` twice, then verifies.

Three runs of 40 steps: K=4 with the gate (every 4th step read, nothing overwritten, nothing
parked), K=1 with the gate (every step read), K=1 without the gate (reads discarded as overwritten,
never wrong, no exception).  Runs on ``torch.cuda`` or the simulated device (``probe_devices``).
"""

from __future__ import annotations

from types import SimpleNamespace as NS

from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.clocks import CudaEventClock
from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory
from sglang_ctxprof.collect.session import CtxProfSession
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.testing.fake_scheduler import PATH as SCHED, FakeScheduler
from sglang_ctxprof.testing.session import Capture

D = None  # the device of this run (probe_devices.TorchCuda or FakeCuda)
LAYERS = 4


class Attn:
    def forward(self):
        D.block()


class MoE:
    def forward(self):
        D.block()


class Model:
    def __init__(self, layers):
        self.layers = [(Attn(), MoE()) for _ in range(layers)]

    def forward(self):
        for a, m in self.layers:
            a.forward()
            m.forward()
            D.tiny()
        return "logits"


class Backend:
    def __init__(self, runner):
        self._cuda_graph_runner, self._graphs, self._outputs = runner, {}, {}

    def capture_one(self, shape_key, forward_fn):
        for _ in range(2):
            forward_fn()
            D.synchronize()
        g = D.CUDAGraph()
        with D.graph(g):
            out = forward_fn()
        self._graphs[shape_key], self._outputs[shape_key] = g, out

    def replay(self, shape_key):
        self._graphs[shape_key].replay()
        return self._outputs[shape_key]

    def cleanup(self):
        self._graphs.clear()
        self._outputs.clear()


class Runner:
    def __init__(self, draft):
        self.model_runner = NS(is_draft_worker=draft)
        self.capture_forward_mode = NS(is_target_verify=lambda: True)
        self.backend = Backend(self)

    def can_run_graph(self, batch):
        return True


class Target_:
    def __init__(self):
        self.model, self.runner = Model(LAYERS), Runner(draft=False)
        self.runner.backend.capture_one("bs", self.model.forward)

    def forward_batch_generation(self, batch, is_verify=False):
        if self.runner.can_run_graph(batch):
            self.runner.backend.replay("bs")
        else:
            self.model.forward()


class Worker:
    def __init__(self):
        self.draft_runner = Runner(draft=True)
        self.draft_runner.backend.capture_one("draft", Model(1).forward)
        self.target = Target_()

    def forward_batch_generation(self, batch):
        self.draft_runner.backend.replay("draft")
        self.target.runner.can_run_graph(batch)  # eagle_prepare_for_verify
        self.target.forward_batch_generation(batch, is_verify=True)
        return NS(accept_lens=None, can_run_cuda_graph=True)


def Req(rid):
    return NS(rid=rid, origin_input_ids=[0] * 64, output_ids=[1], spec_verify_ct=0, finished=lambda: False)


def Batch(reqs):
    return NS(reqs=reqs, forward_mode=NS(is_decode=lambda: True), forward_iter=0)


M = __name__
SCHED_SPEC = (("run_batch", "run_batch"), ("process_batch_result", "process_batch_result"),
              ("is_disable_overlap_for_batch", "overlap_gate"))
SPEC = (("Target_.forward_batch_generation", "verify"),
        ("Attn.forward", "attn"), ("MoE.forward", "moe"), ("Backend.capture_one", "graph_capture"),
        ("Backend.replay", "graph_replay"), ("Backend.cleanup", "graph_cleanup"),
        ("Runner.can_run_graph", "graph_eager_fallback"))


def run(k, gate, steps=40):
    targets = [Target(f"{SCHED}.{m}", h) for m, h in SCHED_SPEC if gate or h != "overlap_gate"]
    targets += [Target(f"{M}.{p}", h) for p, h in SPEC]
    session = CtxProfSession(CtxProfConfig(), targets=targets)
    session.instrument()
    p = session.profiler
    cap = Capture(p)
    try:
        f, why = external_event_factory(D.Event)
        p.graph = GraphTimer(f, D.is_current_stream_capturing, sample_every=k, reason=why)
        sched = FakeScheduler(None, dev=D, streams=True)
        p.bind(sched)
        p.clock = CudaEventClock(event_factory=lambda: D.Event(enable_timing=True))
        sched.model_worker = Worker()
        reqs = [Req(f"r{i}") for i in range(4)]
        sched.loop_overlap([Batch(reqs) for _ in range(steps)])
        recs = cap.records()
        d = p.graph.describe()
        return {"k": k, "gate": gate, "records": len(recs), "sampled_reads": d["sampled_reads"],
                "overwritten": d["overwritten"], "unready": d["unready"], "parked_ever": p.parked.parked,
                "unresolved": p.unresolved, "timed_replays": d["timed_replays"], "events": d["events"],
                "labels": sorted({r.timing for r in recs}), "sglang_syncs": sched.sglang_syncs,
                "degraded": p.guard.status(),
                "attn_ms_sampled": [round(r.phases_ms["verify_attn"], 4) for r in recs if "verify_attn" in r.phases_ms][:5]}
    finally:
        session.uninstrument()


def run_all(dev):
    global D
    D = dev
    k4, k1, k1_nogate = run(4, True), run(1, True), run(1, False)
    ok = (k4["sampled_reads"] == 10 and k4["overwritten"] == 0 and k4["parked_ever"] == 0 and k4["records"] == 40
          and k1["sampled_reads"] == 40 and k1["overwritten"] == 0
          and k1_nogate["overwritten"] > 0 and k1_nogate["records"] == 40 and not k1_nogate["degraded"])
    return {"k4_gate": k4, "k1_gate": k1, "k1_no_gate": k1_nogate, "as_expected": ok}
