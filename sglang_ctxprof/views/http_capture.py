"""The deep-capture routes (``collect.capture`` takes the captures in the schedulers).

* ``POST /ctx_profile/capture?steps=N`` or ``?rid=RID`` (admin level, like reset): ask every rank for
  a capture of the next N steps, or of that request's next steps.  200 when accepted; 429 when the
  budget refuses it (a capture is running, or the cooling-off interval), with ``retry_after_s``;
  the refusal is counted as suppressed in ``/ctx_profile/status``.  ``&wait_s=S`` (default 60): a
  capture not started S seconds after it was asked for fails, judged at the next control request.
* ``POST /ctx_profile/capture/cancel[?id=ID]`` (admin): cancel the pending or running capture (only
  that one, with ``id``): a pending one fails, a running one stops and keeps its steps so far; a
  capture an admin asked for that ends without having started gives back its cooling-off.  404
  when none is.
* ``GET /ctx_profile/capture/{id}[?format=json|trace|timeline]`` (read level): the capture's record
  with the step records it covers; the trace file SGLang's profiler wrote (when it is on this
  host); or the merged timeline (``views.timeline``), built here in the HTTP process, never on
  the scheduler thread: loaded, merged and serialized on the build thread (``http_build.off_loop``),
  one read at a time (the read gate), from a trace file of at most :data:`TIMELINE_MAX_BYTES` (413
  above: fetch ``?format=trace`` instead); a file that cannot be read as a trace is a 409.
"""

from __future__ import annotations

import functools
import math
import os
import re
import zlib
from typing import Any

from starlette.requests import Request

from ..model import names
from ..model.rids import lookup_rid, valid_rid
from .http_build import off_loop
from .http_context import ReadContext, Route

_CAPTURE_ID_RE = re.compile(names.CAPTURE_ID_PATTERN)
TIMELINE_MAX_BYTES = 64 * 2**20  # a trace file merged into a timeline here (its JSON is ~10x in memory)


def routes(rc: ReadContext) -> list[Route]:
    """The capture routes, asking the ranks through ``rc``."""
    return [Route(names.ROUTE_CAPTURE, functools.partial(post_capture, rc), "POST", admin=True),
            Route(names.ROUTE_CAPTURE_CANCEL, functools.partial(cancel_capture, rc), "POST", admin=True),
            Route(names.ROUTE_CAPTURE + "/{cid}", functools.partial(get_capture, rc))]


def _error(status: int, message: str, **extra: Any):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": message, **extra})


def _bad_request(payloads: list[dict[str, Any]]):
    bad = [p["error"] for p in payloads if p.get("bad_request")]
    return _error(400, bad[0]) if bad else None


async def post_capture(rc: ReadContext, request: Request):
    """Ask for a deep capture (``collect.capture``): ``?steps=N`` the next N steps, ``?rid=RID`` that
    request's next steps.  200 when accepted, 429 when the budget refuses (counted as suppressed), 409
    while profiling is off."""
    qp = dict(request.query_params)
    unknown = set(qp) - {"steps", "rid", "wait_s"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    args: dict[str, Any] = {}
    if "wait_s" in qp:
        try:
            args["wait_s"] = float(qp["wait_s"][:40])
        except ValueError:
            args["wait_s"] = math.nan
        if not 0 < args["wait_s"] <= names.CAPTURE_MAX_WAIT_S:
            most = names.CAPTURE_MAX_WAIT_S
            return _error(400, f"wait_s must be above 0 and at most {most:g}, got {qp['wait_s'][:40]}")
    if "steps" in qp:
        most = rc.config.capture.max_steps  # the ranks check it too (their own settings)
        try:
            args["steps"] = int(qp["steps"]) if len(qp["steps"]) <= 12 else most + 1
        except ValueError:
            return _error(400, f"steps must be an integer, got {qp['steps'][:40]!r}")
        if not 1 <= args["steps"] <= most:
            return _error(400, f"steps must be between 1 and {most}, got {qp['steps'][:40]}")
    if "rid" in qp:
        if not valid_rid(qp["rid"]):
            return _error(400, names.RID_MALFORMED)
        args["rid"] = lookup_rid(qp["rid"])  # as the ranks keep it (model.rids)
    payloads = await rc.ask(names.CMD_CAPTURE, **args)
    bad = _bad_request(payloads)
    if bad is not None:
        return bad
    errors = [p["error"] for p in payloads if "error" in p]
    if errors:
        return _error(503, "; ".join(errors))
    refused = [p for p in payloads if not p.get("accepted")]
    if any(p.get("off") for p in refused):
        return _error(409, refused[0].get("reason", "profiling is off"))
    if refused:
        return _error(429, refused[0].get("reason", "refused"), retry_after_s=refused[0].get("retry_after_s"),
                      suppressed=refused[0].get("suppressed"))
    return {"accepted": True, "captures": [p["capture"] for p in payloads]}


async def cancel_capture(rc: ReadContext, request: Request):
    """Cancel the pending or running capture (``?id=``: only that one) on every rank alike."""
    qp = dict(request.query_params)
    unknown = set(qp) - {"id"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    args: dict[str, Any] = {"cancel": True}
    if "id" in qp:
        if not _CAPTURE_ID_RE.match(qp["id"]):
            return _error(400, "malformed capture id")
        args["id"] = qp["id"]
    payloads = await rc.ask(names.CMD_CAPTURE, **args)
    errors = [p["error"] for p in payloads if "error" in p]
    if errors:
        return _error(503, "; ".join(errors))
    done = [p["cancelled"] for p in payloads if p.get("cancelled")]
    if not done:
        why = payloads[0].get("reason", "no capture is pending or running") if payloads else "no ranks"
        return _error(404, why, cancelled=[])
    return {"cancelled": done}


def _load_trace(path: str) -> dict[str, Any]:
    """The trace object in ``path``; ValueError for JSON of another shape, zlib's error for a gzip
    stream damaged inside."""
    import gzip
    import json

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else None
    if not (isinstance(events, list) and all(isinstance(e, dict) for e in events)
            and isinstance(trace.get("otherData", {}), dict)):
        raise ValueError("not a trace object (traceEvents: a list of events, otherData: an object)")
    return trace


async def get_capture(rc: ReadContext, request: Request):
    """One capture: ``?format=json`` (its record and step records), ``trace`` (the file SGLang's
    profiler wrote) or ``timeline`` (``views.timeline``: the trace with our step slices)."""
    cid = request.path_params.get("cid", "")
    if not _CAPTURE_ID_RE.match(cid):
        return _error(400, "malformed capture id")
    qp = dict(request.query_params)
    unknown = set(qp) - {"format"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    fmt = qp.get("format", "json")
    if fmt not in ("json", "trace", "timeline"):
        return _error(400, f"unknown format {fmt!r}; use json, trace or timeline")
    found = [p for p in await rc.ask(names.CMD_CAPTURE, id=cid) if p.get("capture")]
    if not found:
        return _error(404, f"capture {cid!r} not found")
    info = found[0]["capture"]
    if fmt == "json":
        return {"schema_version": names.SCHEMA_VERSION, "capture": info,
                "ranks": [{"rank": p.get("rank"), "capture": p["capture"], "steps": p.get("steps", [])}
                          for p in found]}
    if info.get("state") != names.CAPTURE_DONE:
        why = f": {info['error']}" if info.get("error") else ""
        return _error(409, f"capture {cid!r} is {info.get('state')}{why}")
    path = info.get("path") or ""
    if not os.path.isfile(path):
        return _error(404, f"capture file {path!r} is not on this host")
    if fmt == "trace":
        from fastapi.responses import FileResponse

        return FileResponse(path, filename=os.path.basename(path), media_type="application/gzip")
    size = os.path.getsize(path)
    if size > TIMELINE_MAX_BYTES:
        return _error(413, f"capture file is {size} bytes; a timeline is merged here from at most "
                           f"{TIMELINE_MAX_BYTES}: fetch ?format=trace and open it as it is")
    steps = [(p.get("rank") or i, p.get("steps", [])) for i, p in enumerate(found)]
    return await rc.gate.serve(("timeline", cid), lambda: off_loop(_timeline_reply, path, info, steps))


def _timeline_reply(path: str, info: dict[str, Any], steps: list[tuple[Any, Any]]) -> Any:
    """The merged timeline's JSON reply (on the build thread); 409 when the file is no trace."""
    from .http_guard import json_response
    from .timeline import merged_timeline

    try:
        trace = _load_trace(path)
    except (OSError, EOFError, ValueError, RecursionError, zlib.error) as exc:  # truncated, deleted, no trace
        return _error(409, f"capture file {os.path.basename(path)!r} cannot be read as a trace: "
                           f"{type(exc).__name__}: {str(exc)[:120]}")
    return json_response(merged_timeline(trace, info, steps))
