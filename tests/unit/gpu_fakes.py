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
  gives a wrong number.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace as NS

from fakes import Batch, Mode, Req, Result, ServerArgs  # noqa: F401 - re-exported for tests

from sglang_ctxprof.testing.fake_cuda import FakeDevice

DEV: FakeDevice = FakeDevice()
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


def reset(supports_external=True, record_cost_ms=0.0):
    global DEV
    DEV = FakeDevice(supports_external=supports_external, record_cost_ms=record_cost_ms)
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


class GraphBackend:
    def __init__(self, runner):
        self._cuda_graph_runner = runner
        self._graphs = {}
        self._outputs = {}
        self.captures = 0

    def capture_one(self, shape_key, forward_fn):
        for _ in range(2):  # warm-ups run eagerly, outside the capture
            forward_fn()
            DEV.run()
        g = DEV.CUDAGraph()
        with DEV.graph(g):
            out = forward_fn()
        self.captures += 1
        self._graphs[shape_key] = g
        self._outputs[shape_key] = out

    def replay(self, shape_key, static_forward_batch=None):
        self._graphs[shape_key].replay()
        return self._outputs[shape_key]

    def cleanup(self):
        for g in self._graphs.values():
            g.reset()
        self._graphs.clear()
        self._outputs.clear()


class GraphRunner:
    """DecodeCudaGraphRunner: the target's runs TARGET_VERIFY, a draft runner does not."""

    def __init__(self, use_graph, draft=False):
        self.use_graph = use_graph
        self.model_runner = NS(is_draft_worker=draft)
        self.capture_forward_mode = NS(is_target_verify=lambda: True)
        self.calls = 0
        self.backend = GraphBackend(self)

    def can_run_graph(self, forward_batch):
        self.calls += 1
        return self.use_graph


class TargetWorker:
    def __init__(self, use_graph):
        self.model = Model()
        self.runner = GraphRunner(use_graph)
        self.backend = self.runner.backend
        if use_graph:
            self.backend.capture_one("bs1", self.model.forward)

    def forward_batch_generation(self, batch, is_verify=False, prepared_for_graph=None):
        ran_graph = self.runner.can_run_graph(batch)  # model_runner._forward_raw
        if prepared_for_graph is not None and prepared_for_graph != ran_graph:
            raise RuntimeError("verify forward ran %s with metadata prepared for %s"
                               % ("in a graph" if ran_graph else "eagerly",
                                  "a graph replay" if prepared_for_graph else "eager"))
        if ran_graph:
            self.backend.replay("bs1")
        else:
            self.model.forward()
        return ran_graph


class Worker:
    """EAGLE-shaped speculative worker: draft graph, prepare-for-verify, verify, draft-extend."""

    def __init__(self, use_graph=True, draft_graph=True):
        self.draft_runner = GraphRunner(draft_graph, draft=True)
        self.draft_model = DraftModel()
        if draft_graph:
            self.draft_runner.backend.capture_one("draft-bs1", self.draft_model.forward)
        self.target = TargetWorker(use_graph)

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


class Scheduler:
    def __init__(self, worker, device_sync=True):
        self.model_worker = worker
        self.server_args = ServerArgs()
        self.forward_ct = 0
        self.device_sync = device_sync  # False: the device lags behind the host (query() False)
        self.last_batch = None
        self.result_queue = deque()
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

    def is_disable_overlap_for_batch(self, batch, last_batch):
        return False

    def loop_overlap(self, batches):
        """Scheduler.event_loop_overlap, reduced to what matters here."""
        for batch in list(batches) + [None]:
            disable = self.is_disable_overlap_for_batch(batch, self.last_batch)
            if disable and self.result_queue:
                self.process_batch_result(*self.result_queue.popleft())
            if batch is not None:
                self.result_queue.append((batch, self.run_batch(batch)))
            if self.last_batch is not None and not disable and self.result_queue:
                self.process_batch_result(*self.result_queue.popleft())
            self.last_batch = batch
        while self.result_queue:
            self.process_batch_result(*self.result_queue.popleft())


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
    (f"{M}.GraphBackend.replay", "graph_replay"),
    (f"{M}.GraphBackend.cleanup", "graph_cleanup"),
    (f"{M}.GraphRunner.can_run_graph", "graph_eager_fallback"),
)
