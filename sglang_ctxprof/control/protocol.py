"""The wire protocol of the control channel, shared by the HTTP process and the schedulers.

A command travels as the ``rid`` of SGLang's ``GetInternalStateReq``:
``"__ctx_profile__:" + JSON`` with ``cmd`` (one of the ``CMD_*`` names in ``model.names``) and its
arguments.  The answer is a msgpack-safe dict (str keys, builtins only) under
``internal_state["ctx_profile"]`` of the reply.  Pure: no SGLang import (building SGLang's request
and reply objects is the adapter's job).
"""

from __future__ import annotations

import json
from typing import Any

from ..model.names import CMD_SNAPSHOT, CONTROL_KEY, CONTROL_RID_PREFIX

__all__ = ["encode", "decode", "is_control_rid", "payload_of", "CONTROL_KEY"]


def encode(cmd: str, **args: Any) -> str:
    """The rid that carries command ``cmd`` with keyword arguments ``args`` (JSON builtins)."""
    return CONTROL_RID_PREFIX + ":" + json.dumps({"cmd": cmd, **args}, separators=(",", ":"))


def is_control_rid(rid: Any) -> bool:
    return isinstance(rid, str) and rid.startswith(CONTROL_RID_PREFIX)


def decode(rid: str) -> dict[str, Any]:
    """The command dict of a control rid; a bare prefix means ``snapshot``.  Bad JSON raises."""
    body = rid[len(CONTROL_RID_PREFIX):].lstrip(":")
    if not body:
        return {"cmd": CMD_SNAPSHOT}
    d = json.loads(body)
    if not isinstance(d, dict) or "cmd" not in d:
        raise ValueError("control request without a cmd")
    return d


def payload_of(internal_state: Any) -> dict[str, Any]:
    """Our answer inside one rank's ``internal_state``, or an error dict when that rank has none."""
    st = internal_state or {}
    return st.get(CONTROL_KEY) or {"error": "ctx profiler not active in this scheduler"}
