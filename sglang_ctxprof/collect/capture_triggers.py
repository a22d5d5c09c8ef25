"""The automatic deep-capture triggers, fed each record on the recorder's drain thread.

:class:`AutoTriggers` judges each record after the aggregator took it and asks the capture for one
(``Capture.request``, so the budget applies) when:

* ``slow_factor``: a decode step is slower than that many times its context bucket's prediction
  (the bucket's p50 step time, once it holds ``MIN_BUCKET_STEPS`` steps: warm-up and unseen
  contexts are not judged) for ``slow_run`` steps in a row;
* ``host_gap_ms``: the host gap before a step is above it (a loss mark breaks the gap: steps went
  unrecorded between the two);
* ``slow_request``: a running request the trace policy judges slow; its next steps are captured
  (``collect.tail_trigger``).

All are off by default, and off on a group of several ranks (:meth:`AutoTriggers.bind`): ranks must
take a capture alike, and each rank's drain thread sees its records at its own time.
:class:`CaptureSink` is the recorder sink that feeds them, registered only when one is on.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..aggregate.aggregator import Aggregator
from ..model import names
from ..model.config import CaptureSettings
from ..model.records import HostGap, StepRecord
from ..model.sinks import BindFacts
from .tail_trigger import TailTrigger

logger = logging.getLogger(__name__)

MIN_BUCKET_STEPS = 16  # decode steps a context bucket needs before the slow-step trigger judges

Request = Callable[..., dict[str, Any]]  # ``Capture.request``


class AutoTriggers:
    def __init__(self, cfg: CaptureSettings) -> None:
        self.cfg = cfg
        self.on = cfg.auto  # turned off on multi-rank groups at bind
        self.facts = BindFacts()  # the profiler's, from bind on: the slow-request trigger asks its policy()
        self.tail = TailTrigger() if cfg.slow_request else None
        self._slow = 0  # slow decode steps in a row
        self._gap = HostGap()

    def bind(self, facts: BindFacts, ranks: int) -> None:
        """At the first step: ``facts`` (the slow-request policy); off where several ranks decide."""
        self.facts = facts
        if self.on and ranks > 1:
            self.on = False
            logger.warning("sglang-ctxprof: automatic capture triggers are off with more than one rank per "
                           "group (ranks could disagree); POST /ctx_profile/capture works")

    def gap_break(self) -> None:
        """Steps went unrecorded (profiling off, or lost): the next record's host gap is not measured."""
        self._gap.brk()

    def observe(self, rec: StepRecord, agg: Aggregator, request: Request) -> None:
        """Judge ``rec`` after the aggregator ``agg`` took it (the drain thread, or the thread that
        flushes the recorder, under the sink lock and outside the aggregator's lock, so ``agg`` may
        already hold later records); ``request`` asks for a capture."""
        if not self.on:
            return
        cfg = self.cfg
        if self.tail is not None:  # first: it also names the request
            self.tail.observe(rec, self.facts.policy(), request)
        gap_ms = self._gap.take(rec)  # as the aggregator's host gaps
        if cfg.host_gap_ms > 0 and gap_ms is not None and gap_ms > cfg.host_gap_ms:
            request(names.TRIGGER_HOST_GAP, reason=f"host gap {gap_ms:.1f} ms before step {rec.step_id}",
                    trigger_step=rec.step_id)
        if cfg.slow_factor <= 0 or rec.kind != names.KIND_DECODE or not rec.ctx_lens:
            return
        b = agg.decode.get(agg.bucketing.index(rec.ctx_sum / len(rec.ctx_lens)))
        st = b.phases.get(names.Phase.STEP.value) if b is not None else None
        if st is None or st.count < MIN_BUCKET_STEPS:
            return  # too few steps in this context bucket to predict (warm-up, a new context)
        pred = st.quantile(0.5)
        self._slow = self._slow + 1 if pred > 0 and rec.step_ms > cfg.slow_factor * pred else 0
        if self._slow >= cfg.slow_run:
            self._slow = 0
            request(names.TRIGGER_SLOW_STEP, trigger_step=rec.step_id,
                    reason=f"step {rec.step_id}: {rec.step_ms:.2f} ms > {cfg.slow_factor:g} x "
                           f"{pred:.2f} ms, the p50 of its context bucket ({st.count} steps)")

    def status(self) -> dict[str, Any]:
        """Each trigger's settings and whether it is on (``/ctx_profile/status``)."""
        c = self.cfg
        return {names.TRIGGER_SLOW_STEP: {"factor": c.slow_factor, "run": c.slow_run,
                                          "on": self.on and c.slow_factor > 0},
                names.TRIGGER_HOST_GAP: {"ms": c.host_gap_ms, "on": self.on and c.host_gap_ms > 0},
                names.TRIGGER_SLOW_REQUEST: {"on": self.on and self.tail is not None}}


class CaptureSink:
    """The automatic triggers as a record sink (``capture``): each record, after the aggregator."""

    name = "capture"

    def __init__(self, triggers: AutoTriggers, request: Request, aggregator: Aggregator) -> None:
        self.triggers, self.request, self.aggregator = triggers, request, aggregator

    def observe(self, rec: StepRecord) -> None:
        self.triggers.observe(rec, self.aggregator, self.request)

    def lost(self) -> None:  # steps went unrecorded (the recorder's loss mark): no host gap across them
        self.triggers.gap_break()

    def stop(self) -> None:  # nothing of its own to stop
        return None
