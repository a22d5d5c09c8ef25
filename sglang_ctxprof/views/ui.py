"""The live page ``GET /ctx_profile/ui``: static files shipped as package data, served on SGLang's port.

``sglang_ctxprof/data/ui/`` holds one HTML, one JS and one CSS file of ours plus uPlot (MIT, vendored
from the npm registry with its LICENSE; see ``data/SOURCES.md``), so the page works offline.
The page itself reads the JSON routes (``/ctx_profile``, ``/status``, ``/requests``,
``/requests/{rid}``, ``/diagnosis`` when present) from the same origin; it shows ids, lengths and
timings only, never prompt or output text.  The files are read routes: with ``--api-key`` they need
the key like every other read route (``sglang-ctxprof ui --api-key`` serves them through a local
forwarder that adds it).
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request

# name -> media type; nothing else under data/ui is served.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "LICENSE.uPlot": "text/plain; charset=utf-8",
}


def read(name: str) -> bytes:
    """One of :data:`FILES`, from the installed package (wheel or checkout)."""
    if name not in FILES:
        raise KeyError(name)
    return resources.files("sglang_ctxprof").joinpath("data", "ui", name).read_bytes()


def _response(name: str):
    from fastapi.responses import Response

    return Response(read(name), media_type=FILES[name], headers={"Cache-Control": "no-cache"})


async def get_ui(request: Request):
    return _response("index.html")


async def get_ui_file(request: Request):
    name = request.path_params.get("name", "")
    if name not in FILES:
        from fastapi.responses import JSONResponse

        return JSONResponse(status_code=404, content={"error": f"no such file {name!r}"})
    return _response(name)
