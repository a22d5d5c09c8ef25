"""Scheduler-side handler of ctxprof control requests.

Requests arrive on SGLang's own control channel as ``GetInternalStateReq(rid="__ctx_profile__:{json}")``
(see ``hooks.control``); the JSON carries ``cmd`` and its arguments.  The reply is a msgpack-safe
dict (str keys, builtins only) under ``internal_state["ctx_profile"]``.  A failure here never
raises into SGLang: the tokenizer manager is waiting for exactly one reply per rank, so we always
answer, with ``{"error": ...}`` if need be.

Commands: ``snapshot`` (state + status), ``reset``, ``enable``, ``disable``, ``status``,
``requests`` (``slowest`` N or one ``rid``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from . import hooks
from .names import (CMD_DISABLE, CMD_ENABLE, CMD_RESET, CMD_SNAPSHOT, CMD_STATUS, CONTROL_KEY,
                    CONTROL_RID_PREFIX)

logger = logging.getLogger(__name__)

CMD_REQUESTS = "requests"


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
    try:
        return {CONTROL_KEY: _handle(decode(rid), scheduler)}
    except Exception as exc:  # noqa: BLE001 - always answer, never raise into SGLang
        logger.warning("sglang-ctxprof: control request failed: %r", exc)
        return {CONTROL_KEY: {"error": f"{type(exc).__name__}: {exc}"}}


def _handle(req: dict[str, Any], scheduler: Any) -> dict[str, Any]:
    p = hooks.PROFILER
    if p is None:
        return {"error": "ctx profiler is not installed in this scheduler"}
    p.bind(scheduler)
    p.guard.check_fault("control") if p.guard.fault == "control" else None
    cmd = req["cmd"]
    if cmd == CMD_SNAPSHOT:
        return p.state(with_request_steps=False)
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
    raise ValueError(f"unknown command {cmd!r}")


def _requests(p: Any, req: dict[str, Any]) -> dict[str, Any]:
    if "rid" in req:
        r = p.recorder.with_aggregator(lambda a: a.requests.get(str(req["rid"])))
        return {"requests": [r] if r else []}
    n = int(req.get("slowest", 10))
    rows = p.recorder.with_aggregator(lambda a: a.requests.slowest(n, with_steps=True))
    return {"requests": rows}


def _set_active(p: Any, on: bool) -> None:
    """Runtime toggle: off removes every timing hook (so off costs nothing), on re-installs them."""
    from . import plugin

    if on and not p.active:
        plugin.instrument_timing()
        p.active = True
    elif not on and p.active:
        p.active = False
        if hooks.INSTRUMENTOR is not None:
            hooks.INSTRUMENTOR.uninstrument(groups=["timing"])
        p.pending.clear()
