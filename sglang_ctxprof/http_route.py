"""``/ctx_profile`` routes on SGLang's own FastAPI app (main/HTTP process only).

Data comes from the scheduler processes through SGLang's control channel
(``GetInternalStateReq`` with our marker rid, answered by every DP group's rank 0).  Each answer is a
rank *state*; this module merges them (exact histogram and fit merge) and renders.

Routes (read routes use SGLang's NORMAL auth level: ``--api-key`` protects them; write routes are
ADMIN_OPTIONAL like SGLang's own admin endpoints: ``--admin-api-key`` protects them):

* ``GET  /ctx_profile[?format=json|text|prometheus]`` - per-phase breakdown by context bucket;
* ``POST /ctx_profile/reset``, ``POST /ctx_profile/enable``, ``POST /ctx_profile/disable``;
* ``GET  /ctx_profile/requests?slowest=N`` and ``GET /ctx_profile/requests/{rid}``;
* ``GET  /ctx_profile/status`` - hook report per rank (which functions are wrapped).

Bad input gets a 4xx with ``{"error": ...}``; a failure of ours gets a 500 JSON error and leaves the
server untouched.  Responses hold ids, lengths and timings only, never prompt or output text.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.requests import Request

from . import control, names
from .aggregator import merge_states, summarize

logger = logging.getLogger(__name__)

FORMATS = ("json", "text", "prometheus")
MAX_SLOWEST = 1000
_RID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,256}$")


def _error(status: int, message: str):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": message})


async def _ask(cmd: str, **args: Any) -> list[dict[str, Any]]:
    """Send one control command to every DP group and return their ctx_profile payloads."""
    from sglang.srt.entrypoints.http_server import get_global_state

    from .adapter import make_control_request

    tm = get_global_state().tokenizer_manager
    tm.auto_create_handle_loop()
    outs = await tm.get_internal_state_communicator(make_control_request(control.encode(cmd, **args)))
    payloads = []
    for o in outs:
        st = getattr(o, "internal_state", None) or {}
        payloads.append(st.get(names.CONTROL_KEY) or {"error": "ctx profiler not active in this scheduler"})
    return payloads


def build_profile(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge rank answers into the public JSON: merged view at the top, per-rank views in ``ranks``."""
    good = [p for p in payloads if "state" in p]
    ranks = []
    for p in payloads:
        if "state" not in p:
            ranks.append({"error": p.get("error", "no answer")})
            continue
        ranks.append({"status": p["status"], "profile": summarize(p["state"])})
    merged = summarize(merge_states([p["state"] for p in good])) if good else None
    statuses = [p["status"] for p in good]
    degraded = [s["degraded"] for s in statuses if s.get("degraded")]
    out: dict[str, Any] = {
        "schema_version": names.SCHEMA_VERSION,
        "enabled": bool(statuses) and all(s.get("enabled") for s in statuses),
        "degraded": degraded or None,
        "dropped": sum(int(s.get("dropped", 0)) for s in statuses),
        "ranks": ranks,
    }
    if merged is not None:
        out.update(merged)
    return out


async def get_profile(request: Request):
    fmt = request.query_params.get("format", "json")
    if fmt not in FORMATS:
        return _error(400, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    unknown = set(request.query_params) - {"format"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    try:
        body = build_profile(await _ask(names.CMD_SNAPSHOT))
    except Exception as exc:  # noqa: BLE001
        logger.warning("sglang-ctxprof: /ctx_profile failed: %r", exc)
        return _error(500, f"ctx profile unavailable: {type(exc).__name__}")
    if fmt == "json":
        return body
    from fastapi.responses import PlainTextResponse

    if fmt == "text":
        from .views.text import render

        return PlainTextResponse(render(body))
    from .views.prometheus import render as render_prom

    return PlainTextResponse(render_prom(body), media_type="text/plain; version=0.0.4")


async def _command(request: Request, cmd: str):
    if request.query_params:
        return _error(400, f"unexpected query parameter(s): {', '.join(sorted(request.query_params))}")
    try:
        payloads = await _ask(cmd)
    except Exception as exc:  # noqa: BLE001
        return _error(500, f"ctx profile command failed: {type(exc).__name__}")
    errors = [p["error"] for p in payloads if "error" in p]
    if errors:
        return _error(503, "; ".join(errors))
    return {"ok": True, "command": cmd, "ranks": [p.get("status") for p in payloads]}


async def post_reset(request: Request):
    return await _command(request, names.CMD_RESET)


async def post_enable(request: Request):
    return await _command(request, names.CMD_ENABLE)


async def post_disable(request: Request):
    return await _command(request, names.CMD_DISABLE)


async def get_status(request: Request):
    if request.query_params:
        return _error(400, "this route takes no query parameters")
    payloads = await _ask(names.CMD_STATUS)
    return {"schema_version": names.SCHEMA_VERSION, "ranks": payloads}


async def get_requests(request: Request):
    qp = dict(request.query_params)
    unknown = set(qp) - {"slowest"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    raw = qp.get("slowest", "10")
    try:
        n = int(raw)
    except ValueError:
        return _error(400, f"slowest must be an integer, got {raw!r}")
    if not 1 <= n <= MAX_SLOWEST:
        return _error(400, f"slowest must be between 1 and {MAX_SLOWEST}, got {n}")
    payloads = await _ask(control.CMD_REQUESTS, slowest=n)
    rows = [r for p in payloads for r in p.get("requests", [])]
    rows.sort(key=lambda r: r.get("decode_tok_s", 0.0))
    return {"schema_version": names.SCHEMA_VERSION, "requests": rows[:n]}


async def get_request(request: Request):
    rid = request.path_params.get("rid", "")
    if not _RID_RE.match(rid):
        return _error(400, "malformed rid: use 1-256 characters of letters, digits, _ . : -")
    payloads = await _ask(control.CMD_REQUESTS, rid=rid)
    rows = [r for p in payloads for r in p.get("requests", [])]
    if not rows:
        return _error(404, f"request {rid!r} not found in the recent-request ring")
    return rows[0]


def install_routes(app: Any = None) -> None:
    from sglang.srt.utils.auth import AuthLevel, auth_level

    if app is None:
        from sglang.srt.entrypoints.http_server import app
    if any(getattr(r, "path", None) == names.ROUTE for r in app.router.routes):
        return
    admin = auth_level(AuthLevel.ADMIN_OPTIONAL)
    r = names.ROUTE
    app.add_api_route(r, get_profile, methods=["GET"])
    app.add_api_route(f"{r}/reset", admin(post_reset), methods=["POST"])
    app.add_api_route(f"{r}/enable", admin(post_enable), methods=["POST"])
    app.add_api_route(f"{r}/disable", admin(post_disable), methods=["POST"])
    app.add_api_route(f"{r}/status", get_status, methods=["GET"])
    app.add_api_route(f"{r}/requests", get_requests, methods=["GET"])
    app.add_api_route(f"{r}/requests/{{rid}}", get_request, methods=["GET"])
