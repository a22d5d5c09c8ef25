"""The slow-request capture trigger: a running request that the trace policy judges slow gets its
next steps captured.

The trace policy (``views.policy.TracePolicy``, the same object the trace sinks decide with; the
capture reads it at each record through ``BindFacts.policy``, so that ``POST /ctx_profile/trace_policy``
changes it at run time) judges a
*finished* request from its whole history.  This trigger asks it the same question about a request
that is still running, after each of its decode steps, with the totals so far (steps, decode tok/s,
slowest step: the keys of a ``request_log`` summary).  Two differences, both on purpose:

* the tok/s criterion is not judged before ``MIN_STEPS`` decode steps (a first step alone is not a
  rate); the slowest-step criterion is final as soon as one step crosses it;
* a request that finished in the step that made it slow is not captured: nothing of it is left to
  run.

Each request is judged slow at most once: it fires one ``rid`` capture of its next ``steps`` steps
(``Capture.request``, so the budget applies: one capture at a time, the cooling-off interval, the
step cap), or is suppressed and counted once.  Per running request it keeps four numbers, dropped
when the request finishes (bounded by ``MAX_TRACKED``).  Runs on the recorder's drain thread, only
when ``SGLANG_CTXPROF_CAPTURE_SLOW_REQUEST=1``: off, it is not registered at all.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..aggregate.request_entry import tok_s as _tok_s
from ..model import names
from ..model.records import StepRecord
from ..model.sinks import Policy

MIN_STEPS = 4  # decode steps before the tok/s criterion judges a running request
MAX_TRACKED = 8192  # running requests tracked at once (the oldest are forgotten first)


def running_reason(policy: Optional[Policy], steps: int, committed: int, decode_ms: float,
                   max_step_ms: float) -> str:
    """Why a running request with these totals is slow by ``policy``, or ""."""
    if policy is None or steps <= 0:
        return ""
    if steps < MIN_STEPS:
        return policy.slow_reason({"steps": 0, "max_step_ms": max_step_ms})  # the slow-step criterion only
    tok_s = _tok_s({"committed": committed, "decode_ms": decode_ms})
    return policy.slow_reason({"steps": steps, "decode_tok_s": tok_s, "max_step_ms": max_step_ms})


class TailTrigger:
    def __init__(self) -> None:
        self._reqs: dict[str, list[float]] = {}  # rid -> [steps, committed, decode_ms, max_step_ms]
        self._judged: set[str] = set()  # running rids already judged slow (fired or suppressed)

    def observe(self, rec: StepRecord, pol: Optional[Policy], request: Callable[..., dict[str, Any]]) -> None:
        """One record, judged by the trace policy ``pol`` as it is now; ``request`` is ``Capture.request``."""
        if rec.kind != names.KIND_DECODE:
            return
        reqs, ms = self._reqs, rec.step_ms
        for rid, com, fin in zip(rec.rids, rec.committed, rec.finished):
            t = reqs.get(rid)
            if t is None:
                if len(reqs) >= MAX_TRACKED:
                    old = next(iter(reqs))
                    del reqs[old]
                    self._judged.discard(old)
                t = reqs[rid] = [0, 0, 0.0, 0.0]
            t[0] += 1
            t[1] += com
            t[2] += ms
            t[3] = max(t[3], ms)
            if fin:
                del reqs[rid]
                self._judged.discard(rid)
                continue
            if rid in self._judged:
                continue
            why = running_reason(pol, int(t[0]), int(t[1]), t[2], t[3])
            if why:
                self._judged.add(rid)
                request(names.TRIGGER_SLOW_REQUEST, rid=rid, trigger_step=rec.step_id,
                        reason=f"request {rid} after {int(t[0])} decode steps: {why}")

    def tracked(self) -> int:
        return len(self._reqs)
