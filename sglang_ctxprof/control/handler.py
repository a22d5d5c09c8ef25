"""Scheduler-side handler of ctxprof control requests.

Requests arrive on SGLang's own control channel as ``GetInternalStateReq(rid="__ctx_profile__:{json}")``
(see ``hooks.control``); the JSON carries ``cmd`` and its arguments.  The reply is a msgpack-safe
dict (str keys, builtins only) under ``internal_state["ctx_profile"]``.  A failure here never
raises into SGLang: the tokenizer manager is waiting for exactly one reply per rank, so we always
answer, with ``{"error": ...}`` if need be.

Commands: ``snapshot`` (state + status), ``reset``, ``enable``, ``disable``, ``status``,
``requests`` (``slowest`` N or one ``rid``), and the test-only ``fault`` switch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..collect import hooks
from ..model.names import (CMD_DISABLE, CMD_ENABLE, CMD_RESET, CMD_SNAPSHOT, CMD_STATUS, CONTROL_KEY, CONTROL_RID_PREFIX)

logger = logging.getLogger(__name__)

CMD_REQUESTS = "requests"
CMD_TRACE_POLICY = "trace_policy"  # issue 4: names.CMD_TRACE_POLICY
CMD_FAULT = "fault"  # test only: see safety.Guard.set_fault


def encode(cmd: str, **args: Any) -> str:
    return CONTROL_RID_PREFIX + ":" + json.dumps({"cmd": cmd, **args}, separators=(",", ":"))


def decode(rid: str) -> dict[str, Any]:
    body = rid[len(CONTROL_RID_PREFIX):].lstrip(":")
    if not body:
        return {"cmd": CMD_SNAPSHOT}
    d = json.loads(body)
    if not isinstance(d, dict) or "cmd" not in d:
        raise ValueError("control request without a cmd")
    return d


def handle(rid: str, scheduler: Any) -> dict[str, Any]:
    """Answer one control request.  A failure of ours marks the ``control`` component degraded
    (one warning with traceback, via the guard) and is answered as ``{"error", "degraded"}``."""
    p = hooks.PROFILER
    try:
        req = decode(rid)
        if req.get("cmd") == CMD_FAULT:
            return {CONTROL_KEY: _fault(p, req)}
        if p is not None and not p.guard.ok("control"):
            return {CONTROL_KEY: {"error": "ctx profiler control disabled after a failure",
                                  "degraded": p.guard.status()}}
        return {CONTROL_KEY: _handle(req, scheduler)}
    except Exception as exc:  # noqa: BLE001 - always answer, never raise into SGLang
        if p is None:
            logger.warning("sglang-ctxprof: control request failed: %r", exc)
            return {CONTROL_KEY: {"error": f"{type(exc).__name__}: {exc}"}}
        p.guard.fail("control", exc)
        return {CONTROL_KEY: {"error": f"{type(exc).__name__}: {exc}", "degraded": p.guard.status()}}


def _fault(p: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Test-only fault switch (needs ``SGLANG_CTXPROF_FAULT=runtime`` at start)."""
    if p is None:
        return {"error": "ctx profiler is not installed in this scheduler"}
    try:
        p.guard.set_fault(str(req.get("component", "")))
    except (PermissionError, ValueError) as exc:
        return {"error": str(exc)}
    return {"status": p.status()}


def _handle(req: dict[str, Any], scheduler: Any) -> dict[str, Any]:
    p = hooks.PROFILER
    if p is None:
        return {"error": "ctx profiler is not installed in this scheduler"}
    p.bind(scheduler)
    p.guard.check_fault("control")
    cmd = req["cmd"]
    if cmd == CMD_SNAPSHOT:
        return p.state(with_request_steps=False, with_requests=False)  # bounded, cheap snapshot
    if cmd == CMD_STATUS:
        return {"status": p.status()}
    if cmd == CMD_RESET:
        p.reset()
        return {"status": p.status(), "reset": True}
    if cmd == CMD_ENABLE:
        _set_active(p, True)
        return {"status": p.status()}
    if cmd == CMD_DISABLE:
        _set_active(p, False)
        return {"status": p.status()}
    if cmd == CMD_REQUESTS:
        return _requests(p, req)
    if cmd == CMD_TRACE_POLICY:
        return _trace_policy(p, req)
    raise ValueError(f"unknown command {cmd!r}")


def _trace_policy(p: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Read (no ``set``) or change the tail-sampling policy (issue 4); bad values answer an error."""
    sinks = getattr(p, "sinks", None)
    if sinks is None:
        return {"error": "tracing sinks are not installed in this scheduler"}
    if req.get("set"):
        try:
            sinks.set_policy(req["set"])
        except (ValueError, TypeError) as exc:
            return {"error": str(exc), "bad_request": True}
    return {"trace_policy": sinks.policy.to_dict(), "exporters": sinks.status()}


def _requests(p: Any, req: dict[str, Any]) -> dict[str, Any]:
    if "rid" in req:
        r = p.recorder.with_aggregator(lambda a: a.requests.get(str(req["rid"])))
        return {"requests": [r] if r else []}
    n = int(req.get("slowest", 10))
    rows = p.recorder.with_aggregator(lambda a: a.requests.slowest(n, with_steps=True))
    return {"requests": rows}


def _set_active(p: Any, on: bool) -> None:
    """Runtime toggle: off removes every timing hook (so off costs nothing), on re-installs them."""
    from .. import plugin

    if on and not p.active:
        plugin.instrument_timing()
        p.active = True
    elif not on and p.active:
        p.active = False
        if hooks.INSTRUMENTOR is not None:
            hooks.INSTRUMENTOR.uninstrument(groups=["timing"])
        p.wrapped_worker = None
        p.pending.clear()
