"""The one object that owns profiling in a scheduler process (OTel's ``BaseInstrumentor`` shape).

:class:`CtxProfSession` builds the :class:`~sglang_ctxprof.collect.profiler.Profiler` (with its
recorder and aggregator), the :class:`~sglang_ctxprof.collect.instrumentor.CtxProfInstrumentor`
and, through a factory the plugin passes in, the exporters.  It is the only writer of the hooks'
handle (``hooks.SESSION``), which ``sglang_ctxprof.phase()`` reads too.

* ``instrument()`` builds everything, sets the handle, installs the ``control`` hooks (always on)
  and then the ``timing`` hooks (``enable()``).
* ``disable()`` / ``enable()`` are the runtime toggle: off removes every timing hook and the
  per-worker wrapper, and lets the recorder's drain thread end once it has drained; on puts them
  back (and the thread, for a scheduler already seen).  The profiler's data is kept.  The control hooks stay:
  the control channel, and the CUDA-graph hooks (``graph_hooks``), which decide what every rank
  launches and so must not depend on when each rank got the toggle.
* ``uninstrument()`` is the exact mirror of ``instrument()``: it restores every wrapper, stops the
  recorder's drain thread and the exporters (log thread, OTel provider), and clears the handle.
  After it nothing at all is recorded.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from ..control.handler import handle
from ..model.config import CtxProfConfig
from ..model.sinks import ExporterSet
from . import adapter_ends, graph_hooks, hooks
from .clocks import Clock
from .instrumentor import CtxProfInstrumentor
from .profiler import Profiler

if TYPE_CHECKING:
    from .adapter import Target

logger = logging.getLogger(__name__)

GROUP_CONTROL = "control"
GROUP_TIMING = "timing"
HOOKS = {**hooks.HOOKS, **graph_hooks.HOOKS}  # every hook kind a target may name

ExporterFactory = Callable[[CtxProfConfig], Optional[ExporterSet]]  # e.g. views.exporters.install


class CtxProfSession:
    def __init__(self, config: Optional[CtxProfConfig] = None, *, targets: Optional[Iterable[Target]] = None,
                 signatures: Optional[dict[str, tuple[str, ...]]] = None,
                 exporters: Optional[ExporterFactory] = None, clock: Optional[Clock] = None) -> None:
        """``clock``: the profiler's interval clock (default: chosen by the device); tests pass a fake."""
        from . import adapter

        self.config = config if config is not None else CtxProfConfig.from_env()
        self.targets = list(adapter.TARGETS if targets is None else targets)
        # the adapter's signature checks belong to the adapter's targets; given targets bring their own
        self.signatures = signatures if signatures is not None else ({} if targets is not None else adapter.SIGNATURES)
        self._exporters = exporters
        self._clock = clock
        self.profiler: Optional[Profiler] = None
        self.instrumentor: Optional[CtxProfInstrumentor] = None

    def instrument(self) -> dict[str, str]:
        """Build the profiler and install every hook; returns the instrumentor's report (path -> ok/why)."""
        if self.profiler is not None:
            logger.warning("sglang-ctxprof: session already instrumented; ignoring the second call")
            return dict(self.instrumentor.report) if self.instrumentor else {}
        if hooks.SESSION is not None:
            logger.warning("sglang-ctxprof: another session holds this process's hooks; not instrumenting")
            return {}
        p = Profiler(self.config, clock=self._clock)
        p.active = False
        self.profiler, self.instrumentor = p, CtxProfInstrumentor()
        if self._exporters is not None:
            p.attach_exporters(self._exporters(self.config))
        hooks.resolve_compiling()
        hooks.SESSION = self
        self.instrumentor.instrument(self.targets, HOOKS, self.signatures, groups=[GROUP_CONTROL])
        self.enable()
        return dict(self.instrumentor.report)

    def enable(self) -> None:
        """Install the timing hooks (again); a no-op when already on."""
        p, inst = self.profiler, self.instrumentor
        if p is None or inst is None or p.active:
            return
        report = inst.instrument(self.targets, HOOKS, self.signatures, groups=[GROUP_TIMING])
        p.hook_report = dict(report)
        p.active = True
        held = adapter_ends.held_rids(p.scheduler) if p.scheduler is not None else None
        if held is not None:  # what finished while profiling was off ends now (partial), not never
            stamp = time.time_ns()
            p.recorder.with_aggregator(lambda a: a.requests.ended_while_off(held, stamp))
        p.resume()
        if p.exporters is not None:  # the exporters' own thread (the log summary's)
            p.guard.run("exporter", p.exporters.resume)

    def disable(self) -> None:
        """Remove every timing hook and the worker wrapper, and let our threads end (the recorder's
        drain, the log summary); recorded data stays readable."""
        p, inst = self.profiler, self.instrumentor
        if p is None or inst is None or not p.active:
            return
        p.active = False
        inst.uninstrument(groups=[GROUP_TIMING])
        p.wrapped_worker = None
        p.pause()
        if p.exporters is not None:  # the log summary thread ends too
            p.guard.run("exporter", p.exporters.pause)

    def uninstrument(self) -> None:
        """The mirror of :meth:`instrument`: stop a running capture (on one rank: several stop it
        together through the control channel's ``disable``), restore SGLang, stop our threads,
        clear the handle."""
        p, inst = self.profiler, self.instrumentor
        if p is None or inst is None:
            return
        cap = p.capture
        if cap.current is not None and cap.ranks == 1 and p.scheduler is not None:
            try:  # one rank: SGLang's profiler stops here (several wait for each other in lockstep)
                cap.halt(p.scheduler)
            except Exception as exc:  # noqa: BLE001 - tearing down: report and go on
                logger.warning("sglang-ctxprof: the running capture did not stop cleanly: %r", exc)
        self.disable()
        hooks.label_phases(None)  # a capture's labelling (a module-level swap), also one run while off
        inst.uninstrument()
        if hooks.SESSION is self:
            hooks.SESSION = None
        p.recorder.close()  # drains, then stops every sink (log thread, OTel provider)
        self.profiler = self.instrumentor = None

    def wrap_worker(self, worker: Any) -> None:
        """Wrap one worker object's ``forward_batch_generation`` (the step span); removed by disable()."""
        p, inst = self.profiler, self.instrumentor
        if p is not None and inst is not None:
            inst.wrap_instance(worker, "forward_batch_generation", hooks.step_span)
            p.wrapped_worker = worker  # also when it was wrapped already: try once

    def handle_control(self, rid: str, scheduler: Any) -> dict[str, Any]:
        return handle(rid, scheduler, self)
