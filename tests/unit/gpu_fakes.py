"""A GPU-shaped fake of the SGLang pieces our CUDA timing touches, on a simulated device.

Shaped like SGLang 0.5.23 where our code relies on it:

* the scheduler mirrors ``Scheduler.event_loop_overlap`` (launch N+1 before processing N unless
  ``is_disable_overlap_for_batch``); the forward runs on a *forward stream*, ``copy_done`` is
  recorded on a *copy stream* after ``copy_stream.wait_stream(forward_stream)``, and
  ``process_batch_result`` waits for that one event (the device runs what it needs and no more:
  step N+1's launched work may still be pending);
* ``GraphBackend`` is ``FullCudaGraphBackend``: two eager warm-ups, then a capture, ``_graphs`` and
  ``_outputs`` by shape key, ``replay`` returns the captured output, ``cleanup`` resets the graphs;
  each backend belongs to a runner (``_cuda_graph_runner``) with SGLang's ``model_runner
  .is_draft_worker`` and ``capture_forward_mode``;
* the EAGLE worker replays a *draft* graph, then asks the target runner's ``can_run_graph`` twice,
  like SGLang: once in ``eagle_prepare_for_verify`` (before the verify forward, which prepares graph
  metadata) and once in ``_forward_raw`` inside verify.  If the two answers differ the fake fails
  like the real one would (metadata prepared for a graph replay, forward run eagerly);
* every kernel's duration depends on the step id (``load``), so a read of another step's events
  gives a wrong number;
* ranks (``make_ranks``): one simulated device, scheduler, worker and profiler per rank, run in
  lockstep; each layer all-reduces through ``testing.fake_comm.FakeComm`` (custom all-reduce's
  capture-order pairing), so ranks that replay different graphs fail loudly; IDLE batches (a DP
  rank with no requests) still draft and verify, as SGLang's do;
* ``TargetWorker``'s capture runs the model runner's ``capture_tail_hooks`` like SGLang's
  ``run_once`` (DSPARK's verify epilogue registers the captured graph's outputs there).
"""

from __future__ import annotations

from types import SimpleNamespace as NS

from fakes import Batch, Mode, Req, Result, ServerArgs  # noqa: F401 - re-exported for tests

from sglang_ctxprof.testing.fake_comm import FakeComm
from sglang_ctxprof.testing.fake_cuda import FakeDevice
from sglang_ctxprof.testing.fake_scheduler import FakeScheduler

DEV: FakeDevice = FakeDevice()
COMM: "FakeComm | None" = None  # the ranks' in-graph all-reduce (None: one rank, no collectives)
RANK = 0  # the rank whose device, scheduler and profiler run now (make_ranks switches it)
LAYERS = 3
DRAFT_LAYERS = 1


def load(step_id):
    """The step-dependent input every kernel's duration depends on (like a context length)."""
    return 100 * step_id


def attn_ms(ctx_sum):  # per layer
    return 0.5 + ctx_sum / 1000.0


def moe_ms(ctx_sum):
    return 0.75 + ctx_sum / 4000.0


REST_MS = 0.25  # per layer, outside the blocks
DRAFT_MS, DRAFT_EXT_MS, OVERHEAD_MS = 2.0, 1.0, 0.5


def draft_ms(step_id):
    return DRAFT_MS + DRAFT_LAYERS * attn_ms(load(step_id))


def expected(step_id):
    ctx_sum = load(step_id)
    return {"verify_attn": LAYERS * attn_ms(ctx_sum), "verify_moe": LAYERS * moe_ms(ctx_sum),
            "verify": LAYERS * (attn_ms(ctx_sum) + moe_ms(ctx_sum) + REST_MS),
            "draft": draft_ms(step_id), "draft_extend": DRAFT_EXT_MS}


def reset(supports_external=True, record_cost_ms=0.0, concurrent=False):
    global DEV, COMM, RANK
    DEV = FakeDevice(supports_external=supports_external, record_cost_ms=record_cost_ms, concurrent=concurrent)
    COMM, RANK = None, 0
    return DEV


class Attn:
    def forward(self):
        DEV.kernel(attn_ms)


class MoE:
    def forward(self):
        DEV.kernel(moe_ms)


class Model:
    def __init__(self):
        self.layers = [(Attn(), MoE()) for _ in range(LAYERS)]

    def forward(self):
        for a, m in self.layers:
            a.forward()
            m.forward()
            DEV.kernel(REST_MS)
            if COMM is not None:  # tensor-parallel: the layer's output is all-reduced
                COMM.all_reduce(DEV, RANK)
        return "logits"


class DraftModel:
    """The draft model uses the same (hooked) attention class as the target."""

    def __init__(self):
        self.attn = [Attn() for _ in range(DRAFT_LAYERS)]

    def forward(self):
        DEV.kernel(DRAFT_MS)
        for a in self.attn:
            a.forward()
        return "draft"


KEEPS_RUNNER = True  # SGLang >= 0.5.17's FullCudaGraphBackend keeps its runner; 0.5.16's does not


class GraphBackend:
    def __init__(self, runner, fail_copy=False):
        if KEEPS_RUNNER:
            self._cuda_graph_runner = runner
        self._graphs = {}
        self._outputs = {}
        self.captures = 0
        self.fail_copy = fail_copy  # this rank runs out of memory capturing a key SGLang never asked for

    def capture_one(self, shape_key, forward_fn):
        for _ in range(2):  # warm-ups run eagerly, outside the capture
            forward_fn()
            DEV.run()
        if self.fail_copy and isinstance(shape_key, tuple):
            raise RuntimeError("CUDA out of memory (capturing a second graph of this shape, this rank only)")
        g = DEV.CUDAGraph()
        with DEV.graph(g):
            out = forward_fn()
        self.captures += 1
        self._graphs[shape_key] = g
        self._outputs[shape_key] = out

    def replay(self, shape_key, static_forward_batch=None):
        g = self.last_replayed = self._graphs[shape_key]
        g.replay()
        return self._outputs[shape_key]

    def cleanup(self):
        for g in self._graphs.values():
            g.reset()
        self._graphs.clear()
        self._outputs.clear()


class GraphRunner:
    """DecodeCudaGraphRunner: the target's runs TARGET_VERIFY, a draft runner does not."""

    def __init__(self, use_graph, draft=False, tp_size=1, fail_copy=False):
        self.use_graph = use_graph
        self.model_runner = NS(is_draft_worker=draft, capture_tail_hooks=[], tp_size=tp_size)
        self.capture_forward_mode = NS(is_target_verify=lambda: True)
        self.calls = 0
        self.backend = GraphBackend(self, fail_copy=fail_copy)

    def can_run_graph(self, forward_batch):
        self.calls += 1
        return self.use_graph

    def capture(self, shapes):
        """DecodeCudaGraphRunner.capture: every shape, through the backend."""
        for shape_key, forward_fn in shapes:
            self.backend.capture_one(shape_key, forward_fn)


class CaptureState:
    """DSPARK's verify epilogue, reduced: a capture tail hook stores the captured graph's outputs by
    batch size (``static_io[bs] = io``), and its sampling-accept graph reads them on every step."""

    def __init__(self):
        self.static_io = {}
        self.reads = self.stale = 0

    def capture_hook(self, bs, graph):
        self.static_io[bs] = graph

    def read(self, bs, replayed):
        self.reads += 1
        if self.static_io.get(bs) is not replayed:
            self.stale += 1  # the outputs of another capture than the graph that just ran


class TargetWorker:
    def __init__(self, use_graph, tp_size=1, capture_state=None, fail_copy=False):
        self.model = Model()
        self.runner = GraphRunner(use_graph, tp_size=tp_size, fail_copy=fail_copy)
        self.backend = self.runner.backend
        self.capture_state = capture_state
        if capture_state is not None:
            self.runner.model_runner.capture_tail_hooks.append(capture_state.capture_hook)
        if use_graph:
            self.runner.capture([("bs1", self.run_once)])

    def run_once(self):
        """The runner's capture forward: the model, then the capture tail hooks (SGLang's run_once)."""
        out = self.model.forward()
        graph = DEV.current.capture
        if graph is not None:
            for hook in self.runner.model_runner.capture_tail_hooks:
                hook("bs1", graph)
        return out

    def forward_batch_generation(self, batch, is_verify=False, prepared_for_graph=None):
        ran_graph = self.runner.can_run_graph(batch)  # model_runner._forward_raw
        if prepared_for_graph is not None and prepared_for_graph != ran_graph:
            raise RuntimeError("verify forward ran %s with metadata prepared for %s"
                               % ("in a graph" if ran_graph else "eagerly",
                                  "a graph replay" if prepared_for_graph else "eager"))
        if ran_graph:
            self.backend.replay("bs1")
            if self.capture_state is not None:
                self.capture_state.read("bs1", self.backend.last_replayed)
        else:
            self.model.forward()
        return ran_graph


class Worker:
    """EAGLE-shaped speculative worker: draft graph, prepare-for-verify, verify, draft-extend."""

    def __init__(self, use_graph=True, draft_graph=True, tp_size=1, capture_state=None, fail_copy=False):
        self.draft_runner = GraphRunner(draft_graph, draft=True, tp_size=tp_size)
        self.draft_model = DraftModel()
        if draft_graph:
            self.draft_runner.capture([("draft-bs1", self.draft_model.forward)])
        self.target = TargetWorker(use_graph, tp_size=tp_size, capture_state=capture_state, fail_copy=fail_copy)

    def forward_batch_generation(self, batch):
        self.draft(batch)
        prepared = self.target.runner.can_run_graph(batch)  # eagle_prepare_for_verify
        ran = self.target.forward_batch_generation(batch, is_verify=True, prepared_for_graph=prepared)
        self.draft_extend(batch)
        DEV.kernel(OVERHEAD_MS)
        res = Result([2] * len(batch.reqs))
        res.can_run_cuda_graph = ran
        return res

    def draft(self, batch):
        if self.draft_runner.use_graph:
            self.draft_runner.backend.replay("draft-bs1")
        else:
            self.draft_model.forward()

    def draft_extend(self, batch):
        DEV.kernel(DRAFT_EXT_MS)


class Scheduler(FakeScheduler):
    """The overlap loop of ``FakeScheduler`` on this module's device: the forward on a forward stream
    with the step's inputs copied into static buffers, ``copy_done`` on a copy stream."""

    def __init__(self, worker, device_sync=True):
        super().__init__(worker)
        self.server_args = ServerArgs()
        self.device_sync = device_sync  # False: the device lags behind the host (query() False)
        self.forward_stream = DEV.Stream("forward")
        self.copy_stream = DEV.Stream("copy")

    def run_batch(self, batch):
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        with DEV.stream(self.forward_stream):
            DEV.set_static(load(self.forward_ct))  # the step's inputs, copied into static buffers
            res = self.model_worker.forward_batch_generation(batch)
        self.copy_stream.wait_stream(self.forward_stream)
        res.copy_done = DEV.Event()
        res.copy_done.record(self.copy_stream)
        return res

    def process_batch_result(self, batch, result):
        if self.device_sync:
            DEV.advance(result.copy_done)  # copy_done.synchronize(): this step's work, nothing more
        for req in batch.reqs:
            req.spec_verify_ct += 1
            req.output_ids.extend([7] * result.accept_lens.vals[0])
        return "processed"


M = __name__
TARGETS_SPEC = (
    (f"{M}.Scheduler.run_batch", "run_batch"),
    (f"{M}.Scheduler.process_batch_result", "process_batch_result"),
    (f"{M}.Scheduler.is_disable_overlap_for_batch", "overlap_gate"),
    (f"{M}.TargetWorker.forward_batch_generation", "verify"),
    (f"{M}.Worker.draft", "draft"),
    (f"{M}.Worker.draft_extend", "draft_extend"),
    (f"{M}.Attn.forward", "attn"),
    (f"{M}.MoE.forward", "moe"),
    (f"{M}.GraphBackend.capture_one", "graph_capture"),
    (f"{M}.GraphRunner.capture", "graph_runner_capture"),
    (f"{M}.GraphBackend.replay", "graph_replay"),
    (f"{M}.GraphBackend.cleanup", "graph_cleanup"),
    (f"{M}.GraphRunner.can_run_graph", "graph_eager_fallback"),
)


class Ranks:
    """``n`` tensor-parallel ranks in one process, run in lockstep, each as its own process would be.

    Each rank gets its own copy of this module (its own device, classes and hooks: ctxprof patches
    rank r's classes only, as it patches one scheduler process), its own scheduler, EAGLE worker and
    ctxprof session; every layer all-reduces through one shared ``FakeComm``.  ``use(r)`` points
    ctxprof's process handle at rank r's session while rank r runs."""

    def __init__(self, n, *, k=4, external=True, fallback="off", capture_state=False, fail_copy_on=None,
                 config=None):
        from sglang_ctxprof.model.config import CtxProfConfig

        self.n = n
        self.comm = FakeComm(n)
        self.mods, self.scheds, self.sessions, self.captures = [], [], [], []
        try:
            for r in range(n):
                self._add_rank(r, k, external, fallback, capture_state, fail_copy_on == r,
                               config or CtxProfConfig())
        except BaseException:
            self.close()
            raise

    def _add_rank(self, r, k, external, fallback, capture_state, fail_copy, config):
        import importlib.util

        from sglang_ctxprof.collect import hooks
        from sglang_ctxprof.collect.adapter import Target
        from sglang_ctxprof.collect.clocks import CudaEventClock
        from sglang_ctxprof.collect.graph_clock import GraphTimer, external_event_factory
        from sglang_ctxprof.collect.session import CtxProfSession
        from sglang_ctxprof.testing.session import Capture

        spec = importlib.util.spec_from_file_location(f"{__name__}_rank{r}", __file__)
        mod = importlib.util.module_from_spec(spec)
        import sys
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mod.DEV, mod.RANK, mod.COMM = FakeDevice(supports_external=external), r, self.comm
        self.mods.append(mod)
        session = CtxProfSession(config, targets=[Target(path, hook) for path, hook in mod.TARGETS_SPEC])
        hooks.SESSION = None
        session.instrument()
        self.sessions.append(session)
        with self.use(r):
            p = session.profiler
            self.captures.append(Capture(p))
            sched = mod.Scheduler(None)
            p.bind(sched)
            p.clock = CudaEventClock(event_factory=lambda: mod.DEV.Event(enable_timing=True))
            factory, reason = external_event_factory(mod.DEV.Event)
            p.graph = GraphTimer(factory, lambda: mod.DEV.is_current_stream_capturing(), sample_every=k,
                                 fallback=fallback, reason=reason)
            self.scheds.append(sched)
            sched.model_worker = mod.Worker(tp_size=self.n, fail_copy=fail_copy,
                                            capture_state=mod.CaptureState() if capture_state else None)

    @property
    def devs(self):
        return [m.DEV for m in self.mods]

    def use(self, r):
        import contextlib

        from sglang_ctxprof.collect import hooks

        @contextlib.contextmanager
        def ctx():
            saved = hooks.SESSION
            hooks.SESSION = self.sessions[r]
            try:
                yield self.sessions[r].profiler
            finally:
                hooks.SESSION = saved
        return ctx()

    def step(self, batches):
        """One scheduler iteration on every rank (``batches[r]``: rank r's batch, None for nothing)."""
        for r, batch in enumerate(batches):
            with self.use(r):
                self.scheds[r].step(batch)

    def drain(self):
        for r in range(self.n):
            with self.use(r):
                self.scheds[r].step(None)
                self.scheds[r].drain()

    def records(self, r):
        return self.captures[r].records()

    def close(self):
        import sys

        from sglang_ctxprof.collect import hooks

        for s in self.sessions:
            hooks.SESSION = s
            s.uninstrument()
        hooks.SESSION = None
        for m in self.mods:
            sys.modules.pop(m.__name__, None)


def decode(*rids):
    """A decode batch of fresh requests, or an IDLE batch (a DP rank with nothing to run) for none."""
    return Batch([Req(r, 100 * (i + 1)) for i, r in enumerate(rids)]) if rids else Batch([], mode="IDLE")
