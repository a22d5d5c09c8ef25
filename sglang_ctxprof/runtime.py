"""The profiler's state inside one scheduler process, and the step life cycle the hooks drive.

``begin_step`` (run_batch) -> phase marks (worker hooks) -> ``end_step`` (run_batch returns; the
builder waits keyed by ``forward_iter``) -> ``before_result``/``after_result`` (process_batch_result,
after SGLang's own synchronization) -> one :class:`StepRecord` -> :class:`Recorder`.

Under the overlap scheduler ``run_batch(N+1)`` runs before ``process_batch_result(N)``; the pending
map is keyed by ``forward_iter`` so the two never mix.  The map is bounded: a builder whose result
never arrives (an aborted batch) is evicted and counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Optional

from . import adapter
from .aggregator import Aggregator, summarize
from .config import CtxProfConfig
from .names import FULL_PHASE_ALGORITHMS, KIND_DECODE, SCHEMA_VERSION
from .records import StepRecord
from .recorder import Recorder
from .safety import Guard
from .step_builder import StepBuilder, release, resolve
from .timing import CpuClock, make_clock

logger = logging.getLogger(__name__)

MAX_PENDING = 64


class Profiler:
    def __init__(self, config: CtxProfConfig) -> None:
        self.config = config
        self.guard = Guard(config.fault)
        self.aggregator = Aggregator(config.bucketing(), request_capacity=config.request_ring,
                                     step_ring=config.step_ring)
        self.recorder = Recorder(self.aggregator, self.guard, maxsize=config.queue_size)
        self.clock: Any = CpuClock()
        self.tls = threading.local()
        self.pending: "OrderedDict[int, StepBuilder]" = OrderedDict()
        self.pending_evicted = 0
        self.unresolved = 0
        self.active = True
        self.algorithm = "NONE"
        self.full_phases = False
        self.rank = None
        self.scheduler = None
        self.started_ns = time.time_ns()
        self.wrapped_workers: list[tuple[Any, str, Any]] = []
        self.hook_report: dict[str, Any] = {}

    # ---- binding to the scheduler (first call) -----------------------------------------------------
    def bind(self, scheduler: Any) -> None:
        if self.scheduler is scheduler:
            return
        self.scheduler = scheduler
        sa = getattr(scheduler, "server_args", None)
        self.algorithm = adapter.algorithm_name(sa)
        self.full_phases = self.algorithm in FULL_PHASE_ALGORITHMS
        self.rank = adapter.rank_of(scheduler)
        self.clock = make_clock(adapter.device_of(scheduler))
        self.recorder.start()

    # ---- step life cycle ------------------------------------------------------------------------------
    def current(self) -> Optional[StepBuilder]:
        return getattr(self.tls, "step", None)

    def begin_step(self, scheduler: Any, batch: Any) -> Optional[StepBuilder]:
        self.guard.check_fault("hooks")
        self.bind(scheduler)
        kind = adapter.batch_kind(batch)
        if kind is None:
            return None
        b = StepBuilder(kind, time.time_ns())
        self.tls.step = b
        return b

    def end_step(self, b: StepBuilder, batch: Any) -> None:
        self.tls.step = None
        if b.span is None:  # the worker wrapper did not run (e.g. an idle or prebuilt batch)
            return
        self.pending[adapter.step_id(batch)] = b
        while len(self.pending) > MAX_PENDING:
            _, old = self.pending.popitem(last=False)
            release(old, self.clock)
            self.pending_evicted += 1

    def before_result(self, batch: Any) -> Optional[StepBuilder]:
        b = self.pending.get(adapter.step_id(batch))
        if b is not None:
            b.pre = [adapter.req_snapshot(r) for r in batch.reqs]
        return b

    def after_result(self, b: StepBuilder, batch: Any, result: Any) -> None:
        self.pending.pop(adapter.step_id(batch), None)
        try:
            rec = self._record(b, batch, result)
        finally:
            release(b, self.clock)
        if rec is not None:
            self.recorder.submit(rec)

    def _record(self, b: StepBuilder, batch: Any, result: Any) -> Optional[StepRecord]:
        res = resolve(b, self.clock, self.full_phases)
        if res is None:
            self.unresolved += 1
            return None
        step_ms, phases = res
        reqs = batch.reqs
        pre = b.pre or []
        if len(pre) != len(reqs):
            return None
        rids, ctx, acc, com, fin = [], [], [], [], []
        if b.kind == KIND_DECODE:
            accepts = adapter.accept_lens(result, len(reqs))
            spec = self.algorithm != "NONE"
            for i, req in enumerate(reqs):
                rid, ctx_len, vct, emitted = pre[i]
                _, _, vct2, emitted2 = adapter.req_snapshot(req)
                if spec and vct2 == vct:
                    continue  # SGLang did not count this row (overlap overshoot of a finished request)
                rids.append(rid)
                ctx.append(ctx_len)
                acc.append(accepts[i] if i < len(accepts) else 0)
                com.append(max(0, emitted2 - emitted))
                fin.append(adapter.req_finished(req))
        else:
            for i, req in enumerate(reqs):
                rid, ctx_len, _, _ = pre[i]
                rids.append(rid)
                ctx.append(ctx_len)
                acc.append(0)
                com.append(0)
                fin.append(adapter.req_finished(req))
        if not rids:
            return None
        return StepRecord(
            step_id=adapter.step_id(batch), kind=b.kind, algorithm=self.algorithm,
            rank=self.rank, rids=tuple(rids), ctx_lens=tuple(ctx), accepted=tuple(acc),
            committed=tuple(com), finished=tuple(fin),
            draft_tokens=adapter.draft_tokens(result, getattr(self.scheduler, "server_args", None))
            if b.kind == KIND_DECODE else 0,
            step_ms=step_ms, phases_ms=phases, t_start_ns=b.t_start_ns, timing=self.clock.mode,
        )

    # ---- control commands ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.active,
            "pid": os.getpid(),
            "rank": self.rank.to_dict() if self.rank else None,
            "algorithm": self.algorithm,
            "timing": self.clock.mode,
            "submitted": self.recorder.submitted,
            "dropped": self.recorder.dropped,
            "pending": len(self.pending),
            "pending_evicted": self.pending_evicted,
            "unresolved": self.unresolved,
            "degraded": self.guard.status(),
            "hooks": self.hook_report,
        }

    def state(self, with_request_steps: bool = False) -> dict[str, Any]:
        st = self.recorder.with_aggregator(lambda a: a.state(with_request_steps=with_request_steps))
        return {"schema_version": SCHEMA_VERSION, "status": self.status(), "state": st}

    def reset(self) -> None:
        self.recorder.with_aggregator(lambda a: a.reset())

    def summary(self) -> dict[str, Any]:
        return summarize(self.state()["state"])
