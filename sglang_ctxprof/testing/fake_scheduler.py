"""SGLang's ``Scheduler`` reduced to what ctxprof's hooks touch, for the benchmarks and the tests.

``run_batch`` numbers the batch (``forward_ct`` -> ``batch.forward_iter``) and runs the speculative
worker's ``forward_batch_generation``; ``process_batch_result`` counts one verify step per live
request (``spec_verify_ct``) and appends its accepted tokens (``result.accept_lens``, one token when
the result carries none); a finished request's row is skipped, as SGLang skips it.
``is_disable_overlap_for_batch`` is the overlap gate ctxprof hooks, ``loop_overlap`` SGLang's
overlapped event loop reduced to its order: launch step N+1, then process step N (``step`` one
iteration of it, ``drain`` the loop going idle).

On a device (``dev``: ``torch.cuda``, or the simulated one of ``fake_cuda``) each result carries a
``copy_done`` event that ``process_batch_result`` synchronizes, SGLang's one synchronize per step;
with ``streams`` the forward runs on a forward stream and the event is recorded on a copy stream
that waits on it, as SGLang's overlap scheduler does.  Imports only the standard library.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace


class FakeScheduler:
    """Hook targets: ``PATH + ".run_batch"``, ``".process_batch_result"``, ``".is_disable_overlap_for_batch"``,
    ``".send_abort_output"``."""

    def __init__(self, worker, *, device: str = "cpu", dev=None, streams: bool = False,
                 algorithm: str = "EAGLE", draft_tokens: int = 4) -> None:
        self.model_worker = worker
        self.server_args = SimpleNamespace(speculative_algorithm=algorithm,
                                           speculative_num_draft_tokens=draft_tokens, device=device)
        self.forward_ct = 0
        self.dev = dev
        self.forward_stream = dev.Stream() if dev is not None and streams else None
        self.copy_stream = dev.Stream() if dev is not None and streams else None
        self.last_batch = None
        self.result_queue: deque = deque()
        self.sglang_syncs = 0  # synchronize calls SGLang itself makes (one per processed step)

    def run_batch(self, batch):
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        if self.dev is None:
            return self.model_worker.forward_batch_generation(batch)
        if self.forward_stream is None:
            res = self.model_worker.forward_batch_generation(batch)
            res.copy_done = self.dev.Event()
            res.copy_done.record()
            return res
        with self.dev.stream(self.forward_stream):
            res = self.model_worker.forward_batch_generation(batch)
        self.copy_stream.wait_stream(self.forward_stream)
        res.copy_done = self.dev.Event()
        res.copy_done.record(self.copy_stream)
        return res

    def process_batch_result(self, batch, result):
        if self.dev is not None:
            result.copy_done.synchronize()
            self.sglang_syncs += 1
        lens = getattr(result, "accept_lens", None)
        accepted = lens.tolist() if lens is not None else [1] * len(batch.reqs)
        for i, req in enumerate(batch.reqs):
            if req.finished():
                continue  # overshoot row: SGLang does not count it
            req.spec_verify_ct += 1
            req.output_ids.extend([7] * accepted[i])
        return "processed"

    def send_abort_output(self, abort_req, req) -> None:
        """SGLang reports a request it ended outside its steps (aborted while queued) to the tokenizer."""
        self.aborted_outputs = getattr(self, "aborted_outputs", 0) + 1

    def is_disable_overlap_for_batch(self, batch, last_batch) -> bool:
        return False

    def loop_overlap(self, batches) -> None:
        for batch in list(batches) + [None]:
            self.step(batch)
        self.drain()

    def step(self, batch) -> None:
        """One iteration of the overlap loop (``batch`` None: nothing to launch, only process)."""
        disable = self.is_disable_overlap_for_batch(batch, self.last_batch)
        if disable and self.result_queue:
            self.process_batch_result(*self.result_queue.popleft())
        if batch is not None:
            self.result_queue.append((batch, self.run_batch(batch)))
        if self.last_batch is not None and not disable and self.result_queue:
            self.process_batch_result(*self.result_queue.popleft())
        self.last_batch = batch

    def drain(self) -> None:
        """Process every launched step still waiting (the loop going idle)."""
        while self.result_queue:
            self.process_batch_result(*self.result_queue.popleft())

    def get_internal_state(self, recv_req):
        return {"internal": True}



PATH = f"{__name__}.{FakeScheduler.__name__}"
