"""Scheduler-side handler of ctxprof control requests.

A request arrives on SGLang's own control channel (``GetInternalStateReq`` with a control rid, see
``control.protocol``); the ``control`` hook passes it here with the scheduler and the process's
:class:`~sglang_ctxprof.collect.session.CtxProfSession`.  The handler imports neither: it reads the
session's ``profiler`` and calls its ``enable()``/``disable()``.  A failure here never raises into
SGLang: the tokenizer manager waits for exactly one reply per rank, so we always answer, with
``{"error": ...}`` if need be.  A request that is itself wrong (unknown command, bad argument,
undecodable) is answered ``{"error", "bad_request": true}`` and disables nothing; a failure of our
own code disables the ``control`` component.

Commands: ``snapshot`` (state + status; with ``known``, the versions of states the reader holds,
one of which is answered ``unchanged`` without its state), ``reset`` (with ``clock``: and switch the CPU clock), ``enable``,
``disable``, ``status``, ``requests`` (``slowest`` N, with step rows only if ``steps``; or one ``rid``
with them), ``recent`` (the last N step records, as JSON texts, one per row: ``steps_rows``, the newest up to
``names.MAX_TRACE_ROWS`` request rows, ``steps_left_out`` the rest), ``trace_policy``,
``capture`` (request a deep capture, read one by ``id`` with its step records, or ``cancel`` the pending or
running one, or only the one of that ``id``), and the test-only
``fault`` switch.  Every command first lets a running capture notice an idle server, and a pending one
its deadline (``Capture.idle``, by the HTTP process's clock the command carries: ``now``).
A rank whose ``control`` component failed answers every command with an error, except what every
rank must do alike (``_lockstep``: the capture's requests and idle checks, ``enable``, ``disable``),
which it still does.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any, Optional

from ..model.names import (CMD_CAPTURE, CMD_DISABLE, CMD_ENABLE, CMD_FAULT, CMD_RECENT, CMD_REQUESTS,
                           CMD_RESET, CMD_SNAPSHOT, CMD_STATUS, CMD_TRACE_POLICY, CONTROL_KEY, MAX_READ_STEP_ROWS,
                           PAYLOAD_SCHED_S, TRIGGER_MANUAL, TRIGGER_RID)
from .protocol import decode

if TYPE_CHECKING:  # types only: the handler imports no collect/ module at run time
    from ..collect.profiler import Profiler
    from ..collect.session import CtxProfSession

# JSON bodies (control requests and answers) are plain dicts
Json = dict[str, Any]


class BadRequest(ValueError):
    """The request itself is wrong (unknown command, bad argument): answered, nothing disabled."""


def _int(req: Json, key: str, default: int) -> int:
    try:
        return int(req.get(key, default))
    except (TypeError, ValueError):
        raise BadRequest(f"{key} must be an integer, got {req.get(key)!r}") from None

logger = logging.getLogger(__name__)


def handle(rid: str, scheduler: object, session: CtxProfSession) -> Json:
    """Answer one control request.  A failure of ours marks the ``control`` component degraded
    (one warning with traceback, via the guard) and is answered as ``{"error", "degraded"}``."""
    p = session.profiler
    try:
        try:
            req = decode(rid)
        except ValueError as exc:  # bad JSON too (JSONDecodeError is a ValueError)
            raise BadRequest(f"undecodable control request: {exc}") from None
        if req.get("cmd") == CMD_FAULT:
            return {CONTROL_KEY: _fault(p, req)}
        if p is not None and not p.guard.ok("control"):
            out = _lockstep(req, scheduler, session, p)  # still, or the ranks would part
            if out is not None:
                return {CONTROL_KEY: {**out, "degraded": p.guard.status()}}
            return {CONTROL_KEY: {"error": "ctx profiler control disabled after a failure",
                                  "degraded": p.guard.status()}}
        if p is None:
            return {CONTROL_KEY: {"error": "ctx profiler is not installed in this scheduler"}}
        t0 = time.thread_time()
        out = _handle(req, scheduler, session, p)  # a failure is answered below
        return {CONTROL_KEY: {**out, PAYLOAD_SCHED_S: time.thread_time() - t0}}  # the read gate counts it
    except BadRequest as exc:
        return {CONTROL_KEY: {"error": str(exc), "bad_request": True}}
    except Exception as exc:  # noqa: BLE001 - always answer, never raise into SGLang
        if p is None:
            logger.warning("sglang-ctxprof: control request failed: %r", exc)
            return {CONTROL_KEY: {"error": f"{type(exc).__name__}: {exc}"}}
        p.guard.fail("control", exc)
        return {CONTROL_KEY: {"error": f"{type(exc).__name__}: {exc}", "degraded": p.guard.status()}}


def _fault(p: Optional[Profiler], req: Json) -> Json:
    """Test-only fault switch (needs ``SGLANG_CTXPROF_FAULT=runtime`` at start)."""
    if p is None:
        return {"error": "ctx profiler is not installed in this scheduler"}
    try:
        p.guard.set_fault(str(req.get("component", "")))
    except (PermissionError, ValueError) as exc:
        return {"error": str(exc)}
    return {"status": p.status()}


def _lockstep(req: Json, scheduler: object, session: CtxProfSession, p: Profiler) -> Optional[Json]:
    """What every rank does alike, also one whose ``control`` component failed: a running capture
    notices an idle server, a capture is asked for, profiling is switched on or off.  SGLang's
    profiler stops with a barrier across the TP group, and switching the hooks changes which CUDA
    graphs a rank replays: one rank left out of these would hang the group or split it.  Every
    rank sees the same control requests at the same point of its loop.  The command's answer, or
    None for any other command."""
    cmd, cap = req.get("cmd"), p.capture
    if cap.armed:
        now = req.get("now")  # the HTTP process's clock: the same on every rank
        cap.idle(scheduler, float(now) if isinstance(now, (int, float)) and math.isfinite(now) else None)
    if cmd == CMD_ENABLE:
        if not p.active:  # one an automatic trigger asked for while off, from records drained after it
            cap.halt(scheduler)
        session.enable()
        return {"status": p.status()}
    if cmd == CMD_DISABLE:
        cap.halt(scheduler)
        session.disable()
        return {"status": p.status()}
    if cmd == CMD_CAPTURE and req.get("cancel") is True:
        cid = req.get("id")
        return cap.cancel(scheduler, None if cid is None else str(cid))
    if cmd == CMD_CAPTURE and "id" not in req:
        return _capture(p, req)
    return None


def _handle(req: Json, scheduler: object, session: CtxProfSession, p: Profiler) -> Json:
    cmd = req["cmd"]
    out = _lockstep(req, scheduler, session, p)
    if out is not None:
        return out
    if cmd == CMD_SNAPSHOT:
        p.identify(scheduler)  # facts for the status; starts nothing
        known = req.get("known", [])
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            raise BadRequest(f"known must be a list of state versions, got {known!r:.80}")
        return p.state(with_request_steps=False, with_requests=False, known=known)  # bounded, cheap snapshot
    if cmd == CMD_STATUS:
        return {"status": p.status()}
    if cmd == CMD_RESET:
        clock = req.get("clock")  # optional: time the steps from now on on this CPU clock (names.CLOCKS)
        try:
            p.reset(None if clock is None else str(clock))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return {"status": p.status(), "reset": True}
    if cmd == CMD_REQUESTS:
        return _requests(p, req)
    if cmd == CMD_TRACE_POLICY:
        return _trace_policy(p, req)
    if cmd == CMD_CAPTURE:
        return _capture(p, req)
    if cmd == CMD_RECENT:
        n = _int(req, "last", 0)
        rows, left = p.recorder.with_aggregator(lambda a: a.recent_steps_json(n))
        return {"status": p.status(), "steps_rows": rows, "steps_left_out": left}
    raise BadRequest(f"unknown command {cmd!r}")


def _trace_policy(p: Profiler, req: Json) -> Json:
    """Read (no ``set``) or change the tail-sampling policy; bad values answer an error."""
    exp = p.exporters
    if exp is None:
        return {"error": "tracing sinks are not installed in this scheduler"}
    if req.get("set"):
        try:
            exp.set_policy(req["set"])
        except (ValueError, TypeError) as exc:
            return {"error": str(exc), "bad_request": True}
    return {"trace_policy": exp.policy_dict(), "exporters": exp.status()}


def _capture(p: Profiler, req: Json) -> Json:
    """``id``: that capture and the step records it covers; else request one (``steps``, ``rid``,
    ``wait_s``, and ``now``, the HTTP process's clock, so every rank judges the cooling-off alike)."""
    cap = p.capture
    if "id" in req:
        info = cap.find(str(req["id"]))
        if info is None:
            return {"capture": None}
        ids = set(info.step_ids)
        steps = p.recorder.with_aggregator(lambda a: [r.to_dict() for r in a.recent if r.step_id in ids])
        return {"capture": info.to_dict(), "steps": steps, "rank": p.serving.rank.to_dict() if p.serving.rank else None}
    try:
        if not p.active:  # nothing would run it: refused alike on every rank (the switch is lockstep)
            return {"accepted": False, "off": True, "reason": "profiling is off: POST /ctx_profile/enable first"}
        out = cap.request(TRIGGER_RID if req.get("rid") else TRIGGER_MANUAL, req.get("steps"), req.get("rid"),
                          now_s=req.get("now"), wait_s=req.get("wait_s"))
    except (TypeError, ValueError) as exc:
        return {"error": str(exc), "bad_request": True}
    return out


def _requests(p: Profiler, req: Json) -> Json:
    if "rid" in req:
        r = p.recorder.with_aggregator(lambda a: a.request_with_waterfall(str(req["rid"])))
        if r:
            r = {**r, "captures": p.capture.for_rid(str(req["rid"]))}
        return {"requests": [r] if r else []}
    n = _int(req, "slowest", 10)
    steps = req.get("steps", False) is True  # step rows only when asked (the CLI's trace --slowest)
    budget = MAX_READ_STEP_ROWS if steps else None
    rows = p.recorder.with_aggregator(lambda a: a.requests.slowest(n, with_steps=steps, max_rows=budget))
    return {"requests": rows}
