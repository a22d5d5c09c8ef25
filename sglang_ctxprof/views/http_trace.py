"""``GET /ctx_profile/trace.json?last=N`` or ``?rid=RID``: Chrome trace events, from the HTTP process.

``last=N`` (at most ``names.MAX_TRACE_STEPS``, the steps each rank keeps): each rank ships its last N
step rows as JSON texts (``steps_rows``), and the build thread's :class:`~.trace_json.TraceWriter`
lays each step's events out once while it stays among the steps read, so a read loop writes only
the new ones.  The read runs through ``views.http_gate`` like the other building reads.  ``rid=RID``:
that request's steps from the recent-request ring, 404 when it is not there.  Bad input is a 400.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..model import names
from ..model.rids import lookup_rid
from .http_context import ReadContext, Route
from .http_guard import error as _error
from .trace_json import TraceWriter

_RID_RE = re.compile(names.RID_PATTERN)
TRACE_WRITER = TraceWriter()  # used on the build thread only (http_build.off_loop)


def routes(rc: ReadContext) -> list[Route]:
    """The trace route, reading through ``rc``."""
    return [Route(names.ROUTE_TRACE_JSON, functools.partial(get_trace_json, rc))]


async def get_trace_json(rc: ReadContext, request: Request):
    """Chrome trace events of the last ``last`` steps per rank (bounded), or of one ``rid``."""
    from .trace_events import request_trace

    qp = dict(request.query_params)
    unknown = set(qp) - {"last", "rid"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    if "rid" in qp:
        if "last" in qp:
            return _error(400, "give either last=N or rid=RID, not both")
        if not _RID_RE.match(qp["rid"]):
            return _error(400, "malformed rid: use 1-256 characters of letters, digits, _ . : -")
        rows = [r for p in await rc.ask(names.CMD_REQUESTS, rid=lookup_rid(qp["rid"])) for r in p.get("requests", [])]
        if not rows:
            return _error(404, f"request {qp['rid']!r} not found in the recent-request ring")
        return request_trace(rows[0])
    raw = qp.get("last", str(names.DEFAULT_TRACE_STEPS))
    try:
        n = int(raw)
    except ValueError:
        return _error(400, f"last must be an integer, got {raw!r}")
    if not 1 <= n <= names.MAX_TRACE_STEPS:
        return _error(400, f"last must be between 1 and {names.MAX_TRACE_STEPS} (each rank keeps the "
                           f"last {names.MAX_TRACE_STEPS} steps), got {n}")
    return await rc.gate.serve(("trace", n), lambda: rc.read(names.CMD_RECENT, {"last": n}, trace_reply, n))


def trace_reply(payloads: list[dict[str, Any]], n: int) -> Response:
    """The ranks' step rows written by the build thread's ``TraceWriter``; 503 when no rank answered."""
    errors = [p["error"] for p in payloads if "error" in p]
    if errors and len(errors) == len(payloads):
        return _error(503, "; ".join(errors))
    ranks = [((p.get("status") or {}).get("rank") or i, p.get("steps_rows") or [])
             for i, p in enumerate(payloads) if "error" not in p]
    return Response(content=TRACE_WRITER.render(ranks, n).encode(), media_type="application/json")
