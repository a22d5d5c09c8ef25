"""A GPU-shaped fake of the SGLang pieces our CUDA timing touches, on a simulated device.

The scheduler mirrors ``Scheduler.event_loop_overlap`` (launch N+1 before processing N unless
``is_disable_overlap_for_batch``), ``process_batch_result`` waits for the step's ``copy_done``
like SGLang's ``copy_done.synchronize()`` (here: the device catches up with everything launched, the
worst case), the target worker replays a captured graph (``GraphBackend.capture_one`` with two eager
warm-ups, ``replay``) unless ``GraphRunner.can_run_graph`` says no, and every kernel's duration
depends on the step id (``load``), so a read of another step's events gives a wrong number.
"""

from __future__ import annotations

from collections import deque

from fakes import Batch, Mode, Req, Result, ServerArgs  # noqa: F401 - re-exported for tests

from sglang_ctxprof.testing.fake_cuda import FakeDevice

DEV: FakeDevice = FakeDevice()
LAYERS = 3


def load(step_id):
    """The step-dependent input every kernel's duration depends on (like a context length)."""
    return 100 * step_id


def attn_ms(ctx_sum):  # per layer
    return 0.5 + ctx_sum / 1000.0


def moe_ms(ctx_sum):
    return 0.75 + ctx_sum / 4000.0


REST_MS = 0.25  # per layer, outside the blocks
DRAFT_MS, DRAFT_EXT_MS, OVERHEAD_MS = 2.0, 1.0, 0.5


def expected(step_id):
    ctx_sum = load(step_id)
    return {"verify_attn": LAYERS * attn_ms(ctx_sum), "verify_moe": LAYERS * moe_ms(ctx_sum),
            "verify": LAYERS * (attn_ms(ctx_sum) + moe_ms(ctx_sum) + REST_MS),
            "draft": DRAFT_MS, "draft_extend": DRAFT_EXT_MS}


def reset(supports_external=True):
    global DEV
    DEV = FakeDevice(supports_external=supports_external)
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


class GraphBackend:
    def __init__(self):
        self.graphs = {}

    def capture_one(self, shape_key, forward_fn):
        for _ in range(2):  # warm-ups run eagerly, outside the capture
            forward_fn()
            DEV.run()
        with DEV.graph() as g:
            forward_fn()
        self.graphs[shape_key] = g

    def replay(self, shape_key):
        self.graphs[shape_key].replay()


class GraphRunner:
    def __init__(self, use_graph):
        self.use_graph = use_graph

    def can_run_graph(self, forward_batch):
        return self.use_graph


class TargetWorker:
    def __init__(self, use_graph):
        self.model = Model()
        self.backend = GraphBackend()
        self.runner = GraphRunner(use_graph)
        if use_graph:
            self.backend.capture_one("bs1", self.model.forward)

    def forward_batch_generation(self, batch, is_verify=False):
        if self.runner.can_run_graph(batch):
            self.backend.replay("bs1")
        else:
            self.model.forward()


class Worker:
    def __init__(self, use_graph=True):
        self.target = TargetWorker(use_graph)

    def forward_batch_generation(self, batch):
        self.draft(batch)
        self.target.forward_batch_generation(batch, is_verify=True)
        self.draft_extend(batch)
        DEV.kernel(OVERHEAD_MS)
        return Result([2] * len(batch.reqs))

    def draft(self, batch):
        DEV.kernel(DRAFT_MS)

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

    def run_batch(self, batch):
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        DEV.set_static(load(self.forward_ct))  # the step's inputs, copied into static buffers
        res = self.model_worker.forward_batch_generation(batch)
        res.copy_done = DEV.Event()
        res.copy_done.record()
        return res

    def process_batch_result(self, batch, result):
        if self.device_sync:
            DEV.run()  # copy_done.synchronize(): the device has (at least) finished this step
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
    (f"{M}.GraphRunner.can_run_graph", "graph_eager_fallback"),
)
