"""The profiler's state inside one scheduler process, and the step life cycle the hooks drive.

``begin_step`` (run_batch) -> phase marks (worker hooks) -> ``end_step`` (run_batch returns; the
builder waits keyed by ``forward_iter``) -> ``before_result``/``after_result`` (process_batch_result,
after SGLang's own synchronization) -> the step's host facts -> :class:`Recorder`, whose drain
thread builds the :class:`StepRecord`.

Under the overlap scheduler ``run_batch(N+1)`` runs before ``process_batch_result(N)``; the pending
map is keyed by ``forward_iter`` so the two never mix.  The map is bounded: a builder whose result
never arrives (an aborted batch) is evicted, counted and told to the recorder (``Recorder.lost``).

GPU: marks are CUDA events on the current stream (``clocks.CudaEventClock``), read here after
SGLang's ``copy_done`` synchronization with ``query()`` only.  Host facts (lengths, acceptance) are
taken at ``after_result`` as per-batch arrays (``host``; the record is built on the drain thread);
if the device times are not ready the step is parked and retried at the next result
(``clocks.Parked``).  Under CUDA graphs ``graph_clock.GraphTimer`` supplies the verify
attention/MoE split on sampled steps.  Each record's ``timing`` says how *that* step was timed
(``step.timing_label``).  ``meta["hw"]``: model/device facts for the roofline; the status names the hooked
attention/MoE classes and the cost.  ``capture`` takes deep captures (SGLang's profiler)."""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Any, Mapping, Optional, Sequence

from . import adapter
from ..aggregate.aggregator import Aggregator
from ..model.config import CtxProfConfig
from ..model.names import (BLOCK_ALGORITHMS, FULL_PHASE_ALGORITHMS, KIND_DECODE, SCHEMA_VERSION,
                           TIMING_CUDA_EVENTS, TIMING_CUDA_GRAPH_EVENTS)
from ..model.sinks import BindFacts, ExporterSet, Policy
from .capture import Capture
from .capture_triggers import CaptureSink
from .cost import Cost
from .host import HostFacts, IdCache
from .recorder import Recorder
from ..model.guard import Guard
from ..model.records import RankId
from .step import StepBuilder, release, resolve, timing_label
from .clocks import Clock, CpuClock, Parked, cpu_clock, make_clock, make_graph_timer
from .graph_clock import GraphTimer

logger = logging.getLogger(__name__)

MAX_PENDING = 64


@dataclass(frozen=True)
class Serving:
    """What the bound scheduler serves, read once (:meth:`Profiler.identify`)."""

    algorithm: str = "NONE"
    rank: Optional[RankId] = None
    spec: bool = False  # a speculative algorithm
    full_phases: bool = False  # every seam of the algorithm is known: the remainder is ``overhead``
    block_drafter: bool = False  # names.BLOCK_ALGORITHMS

    @classmethod
    def of(cls, algorithm: str, rank: Optional[RankId]) -> "Serving":
        return cls(algorithm, rank, algorithm != "NONE", algorithm in FULL_PHASE_ALGORITHMS, algorithm in BLOCK_ALGORITHMS)


class Profiler:
    """``clock``: the interval clock of every mark (default: chosen by the device at bind, the CPU
    clock ``config.clock`` names until then); a test passes a fake one instead of patching ``time``."""

    def __init__(self, config: CtxProfConfig, clock: Optional[Clock] = None) -> None:
        self.config = config
        self.guard = Guard(config.fault)
        self.aggregator = Aggregator(config.bucketing(), request_capacity=config.request_ring)
        self.cost = Cost()
        self.ids = IdCache()  # request ids of the last batch (drain thread)
        self.recorder = Recorder(self.aggregator, self.guard, maxsize=config.queue_size, cost=self.cost)
        self._clock_given = clock is not None
        self.clock_name = config.clock  # names.CLOCKS: the CPU clock (a CUDA device times with events)
        self.clock: Clock = clock if clock is not None else cpu_clock(config.clock)
        self.tls = threading.local()
        self.pending: "OrderedDict[int, StepBuilder]" = OrderedDict()
        self.pending_evicted = 0
        self.unresolved = 0
        self.states_written = 0  # states answered to readers (``state``)
        self.states_unchanged = 0  # reads answered ``unchanged``: the reader held that state
        self.active = True
        self.serving = Serving()
        self.scheduler: Any = None  # the SGLang scheduler identified (identify)
        self._bound: Any = None  # ... and bound (bind)
        self.step_source: Any = None  # the scheduler whose forward_ct the graph replay rule reads
        self.capture_runner: Any = None  # the CUDA-graph runner whose capture() is running
        self.wrapped_worker: Any = None  # the worker whose forward_batch_generation we wrapped
        self.hook_report: dict[str, Any] = {}
        self.exporters: Optional[ExporterSet] = None  # views.exporters.Exporters (attach_exporters)
        self.graph: Optional[GraphTimer] = None  # on CUDA
        self.coverage: Optional[dict[str, Any]] = None  # adapter.model_coverage, computed once
        self.parked: Parked[tuple[StepBuilder, HostFacts]] = Parked()
        self.hw: Optional[dict[str, Any]] = None
        self.capture = Capture(config.capture, self.guard)
        if self.capture.triggers.on:
            self.recorder.sinks.append(CaptureSink(self.capture.triggers, self.capture.request, self.aggregator))

    def attach_exporters(self, exporters: Optional[ExporterSet]) -> None:
        """Feed ``exporters``' sinks every record after the aggregator (and the capture triggers)."""
        self.exporters = exporters
        if exporters is not None:
            self.recorder.sinks.extend(exporters.sinks)

    # ---- binding to the scheduler (first step) ----------------------------------------------------
    def identify(self, scheduler: Any) -> None:
        """Read what ``scheduler`` serves (algorithm, rank, device clock, roofline facts), once.
        Starts nothing: the read-only snapshot command calls only this."""
        if self.scheduler is scheduler:
            return
        self.scheduler = scheduler
        self.serving = Serving.of(adapter.algorithm_name(getattr(scheduler, "server_args", None)),
                                  adapter.rank_of(scheduler))
        if not self._clock_given:
            self.clock = make_clock(adapter.device_of(scheduler), self.clock_name)
        try:
            from ..model.roofline import hw_meta

            self.hw = hw_meta(adapter.model_facts(scheduler), adapter.device_name(scheduler),
                           self.config.roofline.hbm_gbps)
        except Exception as exc:  # noqa: BLE001 - the roofline is then reported unavailable
            self.hw = {"device": None, "hbm_gbps": None, "source": f"facts unavailable: {exc!r}"}

    def bind(self, scheduler: Any) -> None:
        """The first step of ``scheduler``: :meth:`identify` it, then start what recording needs (the
        capture's device, the graph timer, the exporters' facts, the drain thread, paced for the device)."""
        if self._bound is scheduler:
            return
        self.identify(scheduler)
        self._bound = scheduler
        facts = self.bind_facts(scheduler)
        self.capture.bind(scheduler, facts)
        if self.graph is None:
            self.graph = make_graph_timer(adapter.device_of(scheduler), self.config.graph)
        if self.exporters is not None:
            self.guard.run("exporter", self.exporters.bind, facts)
        self.recorder.fit_device(adapter.device_of(scheduler), prompt=self.capture.triggers.on)
        self.recorder.start()

    def pause(self) -> None:
        """Profiling switched off: forget waiting steps, mark running requests partial, measure no host gap
        over the pause (``Aggregator.interrupt``; the capture's too); the drain thread ends when drained."""
        self.drop_pending()
        self.recorder.with_aggregator(lambda a: a.interrupt())
        self.recorder.after_sinks(self.capture.triggers.gap_break)
        self.recorder.park()

    def resume(self) -> None:
        """The mirror of :meth:`pause`: the drain thread again, once bound (else :meth:`bind` starts it)."""
        if self._bound is not None:
            self.recorder.start()

    def bind_facts(self, scheduler: Any) -> BindFacts:
        """What the exporter sinks learn from this process (``model.sinks.BindFacts``)."""
        sa = getattr(scheduler, "server_args", None)
        return BindFacts(primary=scheduler is None or adapter.emits(scheduler), history=self.export_history,
                         model_name=adapter.served_model_name(sa), metrics_enabled=adapter.metrics_enabled(sa),
                         dropped=self.recorder.dropped_count, degraded=self.guard.status, audit=self.audit_lifetime,
                         sink_dropped=partial(getattr, self.recorder, "sink_dropped"), policy=self.trace_policy,
                         counts=self.aggregator.counts, guarded=self.guard.run, watch_faults=self.guard.listen)

    def trace_policy(self) -> Optional[Policy]:
        """The exporters' trace policy as it is now (``ExporterSet.policy``), None without exporters."""
        return self.exporters.policy if self.exporters is not None else None

    def audit_lifetime(self) -> Optional[Mapping[str, int]]:
        """The live self-audit's violations per invariant since start, across resets; None when off."""
        return self.aggregator.audit_lifetime()

    def export_history(self, rid: str, with_steps: bool, stamp: int) -> Optional[dict[str, Any]]:
        """A finished request as the exporters read it, under the aggregator's lock: the use of ``rid``
        that the record or end stamped ``stamp`` finished (step rows only ``with_steps``, copied,
        built if read) and the captures that covered its steps."""
        req = self.recorder.read_aggregator(lambda a: a.finished_request(rid, stamp, True, with_steps))
        if req is not None and self.capture.history:
            req["captures"] = self.capture.for_rid(rid)
        return req

    def ensure_graph(self) -> Optional[GraphTimer]:
        """The graph timer, built at the first CUDA-graph capture (model init, before bind); None without CUDA."""
        if self.graph is None:
            self.graph = make_graph_timer("cuda", self.config.graph)
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
        if self.cost.sample():
            b.cost_ns = 0  # a timed step: the hooks add their own time to it
        b.block = self.serving.block_drafter and kind == KIND_DECODE
        self.tls.step = b
        return b

    def end_step(self, b: StepBuilder, batch: Any) -> None:
        self.tls.step = None
        b.t_end_ns = time.time_ns()
        if b.span is None:  # the worker wrapper did not run (e.g. an idle or prebuilt batch)
            return
        b.step_id = sid = adapter.step_id(batch)
        self.pending[sid] = b
        while len(self.pending) > MAX_PENDING:
            _, old = self.pending.popitem(last=False)
            release(old, self.clock)
            self.pending_evicted += 1
            self.recorder.lost()

    def drop_pending(self) -> int:
        """Forget (and count) the steps still waiting for their results, and the parked ones waiting for
        their device times: their marks go back to the clock, as an evicted step's do (toggled off)."""
        n = len(self.pending) + len(self.parked)
        while self.pending:
            release(self.pending.popitem(last=False)[1], self.clock)
        self.parked.clear(lambda item: release(item[0], self.clock))
        return n

    def before_result(self, batch: Any) -> Optional[StepBuilder]:
        b = self.pending.get(adapter.step_id(batch))
        if b is not None:
            decode = b.kind == KIND_DECODE
            spec = self.serving.spec
            b.pre = adapter.reqs_before(batch.reqs, spec and decode, not (spec and decode))
        return b

    def after_result(self, b: StepBuilder, batch: Any, result: Any) -> None:
        self.pending.pop(b.step_id, None)
        if len(self.parked):
            self.parked.retry(self._finish)
        host = None
        try:
            b.graph_ran = adapter.verify_graph_ran(result)
            host = self._host(b, batch, result)
            if host is not None and self.graph is not None:
                self.graph.read(b)  # graph events: now or never (the next replay overwrites them)
        finally:
            if host is None:
                release(b, self.clock)
        if host is not None and not self._finish((b, host)):
            self.parked.push((b, host), self._evict)

    def _evict(self, item: tuple[StepBuilder, HostFacts]) -> None:
        release(item[0], self.clock)
        self.unresolved += 1
        self.recorder.lost()

    def timing_mode(self) -> str:
        """The best this process can do (status); each record carries its own step's label."""
        if self.graph is not None and self.graph.in_use:
            return TIMING_CUDA_GRAPH_EVENTS
        return self.clock.mode

    def _finish(self, item: tuple[StepBuilder, HostFacts]) -> bool:
        """Resolve device times (never waits); hand the step to the recorder, which builds its record
        on the drain thread.  False: not ready, retry later."""
        b, host = item
        host.t_start_ns = b.t_start_ns
        if type(self.clock) is CpuClock:  # plain integers: resolved on the drain thread (host.record)
            host.builder, host.full_phases = b, self.serving.full_phases
            host.timing = self.clock.mode  # cpu, or cpu_thread on the thread clock
            span = b.span  # never None here: _host made no facts for a step without one
            if b.cost_ns >= 0 and span is not None:
                self.cost.add_step((span[1] - span[0]) / 1e6, None)
            self.recorder.submit(host)
            return True
        res = resolve(b, self.clock, self.serving.full_phases)
        if res is None:
            return False
        release(b, self.clock)
        host.step_ms, host.phases_ms = res
        host.timing = timing_label(b, self.clock.mode)
        if b.cost_ns >= 0:
            events = 2 * (1 + len(b.marks)) if self.clock.mode == TIMING_CUDA_EVENTS else None
            self.cost.add_step(host.step_ms, events)
        self.recorder.submit(host)
        return True

    def _host(self, b: StepBuilder, batch: Any, result: Any) -> Optional[HostFacts]:
        """Host-side facts of the step, read now (they change with the next step); None: no record."""
        if b.span is None:
            self.unresolved += 1
            self.recorder.lost()
            return None
        pre = b.pre
        if pre is None or len(pre[0]) != len(batch.reqs):
            self.unresolved += 1  # its requests changed under it: the step is lost
            self.recorder.lost()
            return None
        reqs, outs, lens_pre, vct_pre, done_pre = pre
        decode = b.kind == KIND_DECODE
        sv = self.serving
        spec = decode and sv.spec
        emitted, vct_post, fin = adapter.reqs_after(reqs, outs, spec)
        sa = getattr(self.scheduler, "server_args", None)
        if decode:
            accepts = adapter.accept_list(result)
            draft = adapter.draft_tokens(result, sa)
        else:
            accepts, draft = None, 0
        host = HostFacts(self.ids, b.step_id, b.kind, sv.algorithm, sv.rank, spec, reqs,
                         lens_pre, vct_pre, emitted, vct_post, fin, accepts, draft)
        host.t_end_ns = b.t_end_ns
        host.done_pre = done_pre
        if decode:
            host.exec_mode, host.exec_reason = adapter.exec_mode(b.graph_ran, sa, len(reqs))
            host.attn_backend = adapter.attn_backend(sa)
            host.draft_depth = adapter.draft_depth(draft, sa) if spec else 0
            host.non_draft_tokens = adapter.non_draft_tokens(result)
            if b.block:
                host.block_size, host.denoise_steps = adapter.block_size(result), b.denoise
        else:
            host.cached_lens, host.retractions = adapter.prefill_counts(reqs)
            host.accepts = adapter.mixed_decode_rows(batch, reqs)
        return host if host.counted() else None

    # ---- control commands ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.active, "pid": os.getpid(),
            "rank": self.serving.rank.to_dict() if self.serving.rank else None,
            "algorithm": self.serving.algorithm,
            "timing": self.timing_mode(),
            "clock": self.clock_name if type(self.clock) is CpuClock else None,  # names.CLOCKS, CPU only
            "split": self.graph.describe() if self.graph is not None else {"mode": "block_events"},
            "drain": "running" if self.recorder.running() else "stopped",  # stopped while off
            "parked": len(self.parked), "submitted": self.recorder.submitted, "dropped": self.recorder.dropped,
            "sink_dropped": self.recorder.sink_dropped,  # aggregated, but a stalled sink never saw them
            "pending": len(self.pending), "pending_evicted": self.pending_evicted, "unresolved": self.unresolved,
            "degraded": self.guard.status(), "hooks": self.hook_report,
            "coverage": self._coverage(),
            "exporters": self.exporters.status() if self.exporters is not None else None,
            "cost": self.cost.to_dict(),
            "capture": self.capture.status(),
            "audit": self._audit(),
            "states": {"written": self.states_written, "unchanged": self.states_unchanged},
        }

    def _audit(self) -> Optional[dict[str, Any]]:  # the self-audit's counts and latest violations, copied
        return self.aggregator.audit.status() if self.aggregator.audit is not None else None

    def _coverage(self) -> dict[str, Any]:
        """Which attention / MoE classes of the served model are hooked (computed once per model)."""
        if self.coverage is None and self.scheduler is not None:
            try:
                self.coverage = adapter.model_coverage(self.scheduler)
            except Exception as exc:  # noqa: BLE001 - status must answer
                self.coverage = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
        cov = dict(self.coverage or {"available": False, "reason": "no step seen yet"})
        if self.graph is not None:
            cov["graph_blocks"] = sorted(self.graph.blocks)
        return cov

    def state(self, with_request_steps: bool = False, with_requests: bool = True,
              known: Sequence[str] = ()) -> dict[str, Any]:
        """The status and the aggregator's state with its ``version``: a token that changes whenever
        the state may (this process, the items submitted, the records and resets the aggregator took,
        the device facts and what the state includes).  A state whose version the reader names in
        ``known`` (it holds that state) is answered ``unchanged`` instead, with no state written."""
        def read(a: Aggregator) -> tuple[str, Optional[dict[str, Any]]]:
            version = (f"{os.getpid()}.{self.recorder.submitted}.{a.records}.{a.resets}."
                       f"{zlib.crc32(repr(self.hw).encode())}.{int(with_request_steps)}{int(with_requests)}")
            if version in known:
                return version, None
            return version, a.state(with_request_steps, with_requests, hw=self.hw)

        version, st = self.recorder.with_aggregator(read)
        if st is None:
            self.states_unchanged += 1
            return {"schema_version": SCHEMA_VERSION, "status": self.status(), "unchanged": version}
        self.states_written += 1
        return {"schema_version": SCHEMA_VERSION, "status": self.status(), "state": st, "version": version}

    def reset(self, clock: Optional[str] = None) -> None:
        """Empty the profile; with ``clock`` (names.CLOCKS), time the steps from now on on that CPU clock
        (between steps, on the scheduler thread that marks them; steps still waiting for their results
        are dropped then: no step mixes two clocks, and a step launched before a plain reset is kept, so
        the requests that finish at it still end).  The sinks still export the requests that finished
        before it (the retired history, until they have seen its last record)."""
        if clock is not None and clock != self.clock_name:
            if type(self.clock) is not CpuClock:
                raise ValueError(f"this rank times its steps with {self.clock.mode}; the clock choice is for CPU servers")
            new = cpu_clock(clock)  # ValueError on an unknown name, before anything changes
            if self.drop_pending():
                self.recorder.lost()  # they ran all the same: no host gap across them, requests miss a step
            self.clock, self.clock_name = new, clock
        self.recorder.with_aggregator(lambda a: a.reset())
        self.recorder.after_sinks(self.aggregator.drop_retired)
