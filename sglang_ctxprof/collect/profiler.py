"""The profiler's state inside one scheduler process, and the step life cycle the hooks drive.

``begin_step`` (run_batch) -> phase marks (worker hooks) -> ``end_step`` (run_batch returns; the
builder waits keyed by ``forward_iter``) -> ``before_result``/``after_result`` (process_batch_result,
after SGLang's own synchronization) -> one :class:`StepRecord` -> :class:`Recorder`.

Under the overlap scheduler ``run_batch(N+1)`` runs before ``process_batch_result(N)``; the pending
map is keyed by ``forward_iter`` so the two never mix.  The map is bounded: a builder whose result
never arrives (an aborted batch) is evicted and counted.

GPU: marks are CUDA events on the current stream (``timing.CudaEventClock``), read here after
SGLang's ``copy_done`` synchronization with ``query()`` only.  Host facts (lengths, acceptance) are
taken at ``after_result``; if the device times are not ready the step is parked and retried at the
next result (``timing.Parked``).  Under CUDA graphs ``graph_timing.GraphTimer`` supplies the
verify attention/MoE split on sampled steps; ``meta["hw"]`` carries model/device facts for the
roofline (``roofline``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Optional

from . import adapter
from ..aggregate.aggregator import Aggregator
from ..model.config import CtxProfConfig
from ..model.names import FULL_PHASE_ALGORITHMS, KIND_DECODE, SCHEMA_VERSION, TIMING_CUDA_GRAPH_EVENTS
from ..model.records import StepRecord
from .recorder import Recorder
from ..model.guard import Guard
from .step import StepBuilder, release, resolve
from .clocks import CpuClock, Parked, make_clock, make_graph_timer

logger = logging.getLogger(__name__)

MAX_PENDING = 64


class Profiler:
    def __init__(self, config: CtxProfConfig) -> None:
        self.config = config
        self.guard = Guard(config.fault)
        self.aggregator = Aggregator(config.bucketing(), request_capacity=config.request_ring)
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
        self.wrapped_worker: Any = None  # the worker whose forward_batch_generation we wrapped
        self.hook_report: dict[str, Any] = {}
        self.sinks: Any = None  # views.exporters.Sinks, built by the session's exporter factory
        self.graph: Any = None  # graph_timing.GraphTimer on CUDA
        self.parked = Parked()
        self.hw: Optional[dict[str, Any]] = None

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
        if self.graph is None:
            self.graph = make_graph_timer(adapter.device_of(scheduler), self.config.graph.sample_every,
                                          self.config.graph.fallback)
        try:
            from ..model.roofline import hw_meta

            self.hw = hw_meta(adapter.model_facts(scheduler), adapter.device_name(scheduler),
                           self.config.roofline.hbm_gbps)
        except Exception as exc:  # noqa: BLE001 - the roofline is then reported unavailable
            self.hw = {"device": None, "hbm_gbps": None, "source": f"facts unavailable: {exc!r}"}
        self.recorder.start()

    def ensure_graph(self) -> Any:
        """The graph timer; built on the first CUDA-graph capture (model init runs before bind)."""
        if self.graph is None:
            self.graph = make_graph_timer("cuda", self.config.graph.sample_every, self.config.graph.fallback)
        return self.graph

    # ---- step life cycle ------------------------------------------------------------------------------
    def current(self) -> Optional[StepBuilder]:
        return getattr(self.tls, "step", None)

    def begin_step(self, scheduler: Any, batch: Any) -> Optional[StepBuilder]:
        self.bind(scheduler)
        kind = adapter.batch_kind(batch)
        if kind is None:
            return None
        b = StepBuilder(kind, time.time_ns())
        if self.graph is not None:
            self.graph.begin_step(adapter.next_step_id(scheduler))
        self.tls.step = b
        return b

    def end_step(self, b: StepBuilder, batch: Any) -> None:
        self.tls.step = None
        b.t_end_ns = time.time_ns()
        if b.span is None:  # the worker wrapper did not run (e.g. an idle or prebuilt batch)
            return
        self.pending[adapter.step_id(batch)] = b
        while len(self.pending) > MAX_PENDING:
            _, old = self.pending.popitem(last=False)
            release(old, self.clock)
            self.pending_evicted += 1

    def drop_pending(self) -> None:
        """Forget the steps still waiting for their results (the runtime toggle turned off)."""
        while self.pending:
            release(self.pending.popitem(last=False)[1], self.clock)

    def before_result(self, batch: Any) -> Optional[StepBuilder]:
        b = self.pending.get(adapter.step_id(batch))
        if b is not None:
            b.pre = [adapter.req_snapshot(r) for r in batch.reqs]
        return b

    def after_result(self, b: StepBuilder, batch: Any, result: Any) -> None:
        self.pending.pop(adapter.step_id(batch), None)
        if len(self.parked):
            self.parked.retry(self._finish)
        host = None
        try:
            host = self._host(b, batch, result)
            if host is not None and self.graph is not None:
                self.graph.read(b)  # graph events: now or never (the next replay overwrites them)
        finally:
            if host is None:
                release(b, self.clock)
        if host is not None and not self._finish((b, host)):
            self.parked.push((b, host), self._evict)

    def _evict(self, item: tuple[StepBuilder, dict]) -> None:
        release(item[0], self.clock)
        self.unresolved += 1

    def timing_mode(self) -> str:
        if self.graph is not None and self.graph.in_use:
            return TIMING_CUDA_GRAPH_EVENTS
        return self.clock.mode

    def _finish(self, item: tuple[StepBuilder, dict]) -> bool:
        """Resolve device times (never waits); submit the record.  False: not ready, retry later."""
        b, host = item
        res = resolve(b, self.clock, self.full_phases)
        if res is None:
            return False
        release(b, self.clock)
        step_ms, phases = res
        self.recorder.submit(StepRecord(step_ms=step_ms, phases_ms=phases, t_start_ns=b.t_start_ns,
                                        timing=self.timing_mode(), t_end_ns=b.t_end_ns, **host))
        return True

    def _host(self, b: StepBuilder, batch: Any, result: Any) -> Optional[dict[str, Any]]:
        """Host-side facts of the step, read now (they change with the next step)."""
        if b.span is None:
            self.unresolved += 1
            return None
        reqs = batch.reqs
        pre = b.pre or []
        if len(pre) != len(reqs):
            return None
        rids, ctx, acc, com, fin = [], [], [], [], []
        extra: dict[str, Any] = {}
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
            tps = tuple(adapter.req_trace_parent(req) for req in reqs)  # the client's trace context
            if any(tps):
                extra["trace_parents"] = tps
            extra["cached_lens"] = tuple(adapter.req_cached_tokens(req) for req in reqs)
        extra.update(self._exec(b, result, len(rids)))
        if not rids:
            return None
        return dict(**extra,
            step_id=adapter.step_id(batch), kind=b.kind, algorithm=self.algorithm,
            rank=self.rank, rids=tuple(rids), ctx_lens=tuple(ctx), accepted=tuple(acc),
            committed=tuple(com), finished=tuple(fin),
            draft_tokens=adapter.draft_tokens(result, getattr(self.scheduler, "server_args", None))
            if b.kind == KIND_DECODE else 0,
        )

    def _exec(self, b: StepBuilder, result: Any, batch_size: int) -> dict[str, Any]:
        """Execution fingerprint and draft budget of the step (decode only; host values)."""
        if b.kind != KIND_DECODE:
            return {}
        sa = getattr(self.scheduler, "server_args", None)
        mode, reason = adapter.exec_mode(result, sa, batch_size)
        return {"exec_mode": mode, "exec_reason": reason, "attn_backend": adapter.attn_backend(sa),
                "draft_depth": adapter.draft_depth(result, sa) if self.algorithm != "NONE" else 0}

    # ---- control commands ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.active,
            "pid": os.getpid(),
            "rank": self.rank.to_dict() if self.rank else None,
            "algorithm": self.algorithm,
            "timing": self.timing_mode(),
            "split": self.graph.describe() if self.graph is not None else {"mode": "block_events"},
            "parked": len(self.parked),
            "submitted": self.recorder.submitted,
            "dropped": self.recorder.dropped,
            "pending": len(self.pending),
            "pending_evicted": self.pending_evicted,
            "unresolved": self.unresolved,
            "degraded": self.guard.status(),
            "hooks": self.hook_report,
            "exporters": self.sinks.status() if self.sinks is not None else None,
        }

    def state(self, with_request_steps: bool = False, with_requests: bool = True) -> dict[str, Any]:
        snap = self.recorder.with_aggregator(lambda a: a.snapshot(with_request_steps=with_request_steps,
                                                                   with_requests=with_requests))
        st = snap.with_hw(self.hw).to_dict()
        return {"schema_version": SCHEMA_VERSION, "status": self.status(), "state": st}

    def reset(self) -> None:
        self.recorder.with_aggregator(lambda a: a.reset())
