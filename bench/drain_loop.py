#!/usr/bin/env python3
"""The fake scheduler loop the drain benches share (``drain_gil``, ``drain_holds``, ``drain_profile``,
``drain_ipc``, ``drain_rows``, ``gc_walk``).

``Sched`` runs SGLang's speculative decode shape (``run_batch`` -> the worker's draft + verify ->
``process_batch_result``) over a ``Batch`` of requests that finish after their ``life`` with the
engine's books set and are replaced; ``_Forward`` is the forward (torch matmuls that release the GIL,
on the CPU or a GPU); ``session`` is the real profiler session with its default exporters, hooked
on this module's ``Sched``; ``calibrate`` sizes one matmul to a target time.

A benchmark's part, not a test.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sglang_ctxprof.testing.fake_scheduler import FakeScheduler  # noqa: E402
from sglang_ctxprof.testing.fake_worker import HOOKS, AcceptLens, FakeReq, FakeWorker  # noqa: E402,F401

CTX = 2048


class _Forward:
    """``ops`` torch matmuls (each releases the GIL) with a little Python around each, as modules have;
    on ``device`` "cuda" they are launched and the step ends in ``torch.cuda.synchronize()`` (the GIL
    released while the GPU computes: a GPU-bound step, for real); then, with ``wait_s``, a sleep (the
    GIL released, no CPU used): the same shape modelled where there is no GPU."""

    ops = 100
    size = 64
    wait_s = 0.0
    device = "cpu"

    def __init__(self) -> None:
        self.a = torch.randn(self.size, self.size, device=self.device)
        self.b = torch.randn(self.size, self.size, device=self.device)

    def run(self) -> None:
        a, b, mm = self.a, self.b, torch.mm
        for i in range(self.ops):
            c = mm(a, b)
            if i & 7 == 0:
                c = c[:1]  # a view: a little more Python, as a module's reshapes are
        if self.device != "cpu":
            torch.cuda.synchronize()
        if self.wait_s:
            time.sleep(self.wait_s)


def engine_garbage(k: int) -> None:
    """``k`` small tracked objects in one reference cycle: garbage only a collection frees."""
    if k <= 0:
        return
    head = node = {}
    for _ in range(k - 1):
        node["next"] = node = {}
    node["next"] = head


class Sched(FakeScheduler):
    """The fake scheduler, whose requests finish after their ``life`` (SGLang's books set) and which
    leaves ``engine_objects`` tracked objects per step for the collector, as SGLang's scheduler
    does: young collections come every ~8-10 decode steps on the real server with profiling off, at
    batch 1, 8 and 32 (``bench/gc_cadence.py``), whatever the profiler adds.  Without them the
    profiler's own objects alone would set the collector's pace."""

    engine_objects = 0

    def process_batch_result(self, batch, result):
        engine_garbage(self.engine_objects)
        out = super().process_batch_result(batch, result)
        for req, a in zip(batch.reqs, batch.result.accept):
            req.spec_num_correct_drafts += a - 1
            if req.spec_verify_ct >= req.life and req.finished_reason is None:
                req.finished_reason = "length"
                req.finished_len = len(req.output_ids)
        return out


_MODE = SimpleNamespace(is_decode=lambda: True)


class Batch:
    """A running batch of ``n`` requests; finished ones are replaced before the next step."""

    def __init__(self, n: int, life: int) -> None:
        self.n, self.life, self.made = n, life, 0
        self.prompt = [0] * (CTX - 1)
        accept = [1 + (i % 3) for i in range(n)]
        self.result = SimpleNamespace(accept_lens=AcceptLens(accept), accept=accept, speculative_num_draft_tokens=4)
        # staggered ages, so about n / life requests finish at each step
        self.reqs = [self._new(life=1 + (i * life) // n) for i in range(n)]
        self.forward_mode, self.forward_iter = _MODE, 0

    def _new(self, life: int) -> FakeReq:
        self.made += 1
        return FakeReq(f"r{self.made}", self.prompt, life)

    def refill(self) -> None:
        reqs = self.reqs
        if any(r.finished_reason is not None for r in reqs):
            self.reqs = [self._new(self.life) if r.finished_reason is not None else r for r in reqs]


def session():
    from sglang_ctxprof.collect.adapter import Target
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import exporters

    M = __name__
    return CtxProfSession(CtxProfConfig(), targets=[
        Target(f"{M}.Sched.run_batch", "run_batch"), Target(f"{M}.Sched.process_batch_result", "process_batch_result")]
        + [Target(path, hook) for path, hook in HOOKS], exporters=exporters.install)


def calibrate(op_us: float, device: str = "cpu") -> int:
    """The matmul size whose one op takes about ``op_us`` on this thread (on a GPU: until synchronized)."""
    sizes = range(16, 512, 8) if device == "cpu" else [int(256 * 1.25 ** k) for k in range(20)]
    for size in sizes:
        a = torch.randn(size, size, device=device)
        best = float("inf")
        for _ in range(5):  # the fastest of 5 tries: a busy machine only slows an op down
            t0 = time.perf_counter()
            for _ in range(20):
                torch.mm(a, a)
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / 20 * 1e6)
        if best >= op_us:
            return size
    return sizes[-1]
