"""``GET /ctx_profile/trace.json?last=N`` or ``?rid=RID``: Chrome trace events, from the HTTP process;
and ``GET|POST /ctx_profile/trace_policy``, the tail-sampling policy of the trace sinks.

``last=N`` (at most ``names.MAX_TRACE_STEPS``, the steps each rank keeps): each rank ships its last N
step rows as JSON texts (``steps_rows``), and the build thread's :class:`~.trace_json.TraceWriter`
lays each step's events out once while it stays among the steps read, so a read loop writes only
the new ones.  The read runs through ``views.http_gate`` like the other building reads.  ``rid=RID``:
that request's steps from the recent-request ring, 404 when it is not there.  Bad input is a 400.
The policy: ``GET`` shows it, ``POST`` (admin; a JSON object of ``mode``, ``slow_tok_s``,
``slow_step_ms``, at most ``MAX_POLICY_BODY`` bytes) changes it on every rank.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..model import names
from .http_context import ReadContext, Route
from .http_guard import MAX_POLICY_BODY, command_failed, error as _error, json_body, json_response as _json
from .trace_json import TraceWriter

TRACE_WRITER = TraceWriter()  # used on the build thread only (http_build.off_loop)


def routes(rc: ReadContext) -> list[Route]:
    """The trace routes, reading through ``rc``."""
    policy = functools.partial(trace_policy, rc)
    return [Route(names.ROUTE_TRACE_JSON, functools.partial(get_trace_json, rc)),
            Route(names.ROUTE_TRACE_POLICY, policy), Route(names.ROUTE_TRACE_POLICY, policy, "POST", admin=True)]


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
        return await rc.request(qp["rid"], "request_trace", lambda row: _json(request_trace(row)))
    raw = qp.get("last", str(names.DEFAULT_TRACE_STEPS))
    try:
        n = int(raw)
    except ValueError:
        return _error(400, f"last must be an integer, got {raw[:40]!r}")
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
    left = sum(int(p.get("steps_left_out") or 0) for p in payloads if "error" not in p)
    return Response(content=TRACE_WRITER.render(ranks, n, left).encode(), media_type="application/json")


async def trace_policy(rc: ReadContext, request: Request):
    """``GET`` shows, ``POST`` (JSON body: mode, slow_tok_s, slow_step_ms) changes the trace policy."""
    if request.query_params:
        return _error(400, "this route takes no query parameters")
    changes = None
    if request.method == "POST":
        changes, bad = await json_body(request, MAX_POLICY_BODY,
                                       "body must be a JSON object like {\"mode\": \"slow\", \"slow_tok_s\": 20}")
        if bad is not None:
            return bad
        if not isinstance(changes, dict) or not changes:
            return _error(400, "body must be a non-empty JSON object (mode, slow_tok_s, slow_step_ms)")
    payloads = await rc.ask(names.CMD_TRACE_POLICY, **({"set": changes} if changes else {}))
    failed = command_failed(payloads)
    if failed is not None:
        return failed
    return {"schema_version": names.SCHEMA_VERSION, "trace_policy": payloads[0]["trace_policy"],
            "ranks": [p.get("exporters") for p in payloads]}
