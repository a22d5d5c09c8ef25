"""``/ctx_profile`` routes on SGLang's own FastAPI app (main/HTTP process only).

Data comes from the scheduler processes through SGLang's control channel
(``GetInternalStateReq`` with our marker rid, answered by every DP group's rank 0).  Each answer is a
rank *state*; this module merges them (exact histogram and fit merge) and renders.

Routes (read routes use SGLang's NORMAL auth level: ``--api-key`` protects them; write routes are
ADMIN_OPTIONAL like SGLang's own admin endpoints: ``--admin-api-key`` protects them):

* ``GET  /ctx_profile[?format=json|text|prometheus]`` - per-phase breakdown by context bucket
  (``prometheus``: 503 unless every rank answered, as fewer ranks' counters would read as a reset);
* ``POST /ctx_profile/reset[?clock=wall|thread]``, ``POST /ctx_profile/enable``, ``POST /ctx_profile/disable``;
* ``GET  /ctx_profile/requests?slowest=N[&steps=1]`` (step rows only with ``steps=1``) and
  ``GET /ctx_profile/requests/{rid}`` or ``?rid=RID`` (with its step rows; a browser drops a path
  segment of ``.`` or ``..``, so the live page asks for such a rid by the query);
* ``GET  /ctx_profile/status`` - hook report per rank (which functions are wrapped);
* ``GET|POST /ctx_profile/trace_policy`` - tail-sampling policy of the trace sinks (``views.http_trace``);
* ``GET  /ctx_profile/diagnosis[?format=json|text][&ctx=N]`` - the verdict (``views.diagnosis``),
  its ledger against the plain reference of ``POST|GET|DELETE /ctx_profile/plain`` (``views.http_plain``);
* ``GET  /ctx_profile/trace.json[?last=N|?rid=RID]`` - Chrome trace events (``views.http_trace``);
* ``GET  /ctx_profile/ui`` and its files - the live page (``views/ui``), a read route like the others;
* ``POST /ctx_profile/capture?steps=N|rid=RID`` (admin) - a deep capture (``collect.capture``);
  ``GET /ctx_profile/capture/{id}[?format=json|trace|timeline]`` - it, its file, the merged timeline;
* ``GET  /ctx_profile?format=state`` - the ranks' merged state (exact histograms), for the fleet view.

The four read routes above that build (profile, diagnosis, slowest requests, trace) run through
``views.http_gate``: their builds take at most a set share of this process, and concurrent readers
share one.  Eight reads are standing there (never refused, turn about with the others): every
format of ``/ctx_profile``, ``/diagnosis`` with no ``ctx``, ``/requests`` without steps at N = 10 or
20.  Bad input gets a 4xx with ``{"error": ...}``.  Every handler runs under the ``http`` fault guard
(``views.http_guard``): replies are serialized inside it; a failure of ours gets a 500 JSON error
with ``degraded`` and one warning with the traceback, and only repeated failures disable the routes
(503 from then on); a cross-origin write is refused (403).  SGLang's own routes are untouched.
Responses hold ids, lengths and timings only, never prompt or output text.

Every handler reads through one ``views.http_context.ReadContext`` (the control client, the read gate,
the configuration, the plain reference) that :func:`install_routes` makes and hands to each route
module's ``routes(rc)`` factory; :func:`uninstall_routes` removes exactly what it added.

Test only: with ``SGLANG_CTXPROF_FAULT=runtime`` at start, ``POST /ctx_profile/fault`` with
``{"component": "<name>"}`` breaks one component (``""`` heals all); see ``safety``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

from starlette.requests import Request
from starlette.responses import Response

from ..control.client import NoAnswer
from ..model import names
from ..aggregate.snapshot import Snapshot, merge
from ..model.guard import COMPONENTS
from ..model.config import CtxProfConfig
from ..model.stats import FitMemo
from .http_body import BodyTexts, served_json
from .http_build import CACHE, off_loop, versions
from .http_context import INSTALLED, Asker, PlainStore, ReadContext, Route
from .http_gate import gate
from .http_guard import (MAX_POLICY_BODY, command_failed, error as _error, guard, guarded as _guarded, json_body,
                         json_response as _json, reset_strikes)
from .profile import Profile, build_profile

logger = logging.getLogger(__name__)

FORMATS = ("json", "text", "prometheus", names.FORMAT_STATE)
MAX_SLOWEST = names.MAX_SLOWEST
DEFAULT_SLOWEST, PAGE_SLOWEST = 10, 20  # /requests with no ?slowest=, the live page's (app.js SLOWEST)


def _built(payloads: list[dict[str, Any]], fits: Optional[FitMemo] = None) -> tuple[list[Any], Profile, BodyTexts]:
    """Each answering rank's profile body (None for a rank that answered an error), the merged
    profile and their JSON texts (written on first use), reusing the recent fits of ``fits``.  One
    rank: its profile is the merged one (``merge`` of one snapshot changes nothing)."""
    snaps = [Snapshot.from_dict(p["state"]) if "state" in p else None for p in payloads]
    ok = [s for s in snaps if s is not None]
    if len(ok) == 1:
        merged = build_profile(ok[0], fits)
        one = merged.to_dict(envelope=False)
        bodies = [one if s is not None else None for s in snaps]
    else:
        bodies = [build_profile(s, fits).to_dict(envelope=False) if s is not None else None for s in snaps]
        merged = build_profile(merge(ok), fits) if ok else Profile(bucketing={})
    return bodies, merged, BodyTexts(bodies, merged)


def served_profile(payloads: list[dict[str, Any]]) -> Profile:
    """Merge rank answers into the served profile: merged view at the top, per-rank views in ``ranks``.
    The build is cached per the ranks' versions (``http_build``); the envelope is read fresh."""
    return _served(payloads)[0]


def _served(payloads: list[dict[str, Any]]) -> tuple[Profile, BodyTexts]:
    cache = CACHE
    bodies, merged, texts = cache.get(versions(payloads), lambda: _built(payloads, cache.fits))
    ranks = [{"status": p["status"], "profile": b} if "state" in p else {"error": p.get("error", "no answer")}
             for p, b in zip(payloads, bodies)]
    statuses = [p["status"] for p in payloads if "state" in p]
    degraded = [s["degraded"] for s in statuses if s.get("degraded")]
    degraded += [p["degraded"] for p in payloads if "state" not in p and p.get("degraded")]
    return merged.served(
        enabled=bool(statuses) and all(s.get("enabled") for s in statuses),
        degraded=degraded or None,
        dropped=sum(int(s.get("dropped", 0)) for s in statuses),
        spans_dropped=sum(int((s.get("exporters") or {}).get("spans_dropped", 0)) for s in statuses),
        ranks=tuple(ranks),
    ), texts


def served_state(payloads: list[dict[str, Any]]):
    """The ranks' states merged exactly (``Snapshot.to_dict()``), for merging several servers; ``answered``
    of ``ranks`` gave one (``missing``: why the others did not)."""
    states = [p for p in payloads if "state" in p]
    if not states:
        return _error(503, "; ".join(p.get("error", "no answer") for p in payloads) or "no scheduler answered")
    snaps = [Snapshot.from_dict(p["state"]) for p in states]
    return {"schema_version": names.SCHEMA_VERSION, "state": merge(snaps).to_dict(), "ranks": len(payloads),
            "answered": len(states), "missing": [str(p.get("error", "no state")) for p in payloads if "state" not in p],
            "dropped": sum(int(p["status"].get("dropped", 0)) for p in states),
            "enabled": all(p["status"].get("enabled") for p in states)}


async def get_profile(rc: ReadContext, request: Request):
    fmt = request.query_params.get("format", "json")
    if fmt not in FORMATS:
        return _error(400, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    unknown = set(request.query_params) - {"format"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    return await rc.gate.serve(("profile", fmt), lambda: _profile_read(rc, fmt), standing=True)


async def _profile_read(rc: ReadContext, fmt: str) -> Any:
    try:
        payloads = await rc.snapshot()
    except NoAnswer:
        raise  # a scheduler's, not ours: the guard's 504
    except Exception as exc:  # noqa: BLE001
        logger.warning("sglang-ctxprof: /ctx_profile failed: %r", exc)
        return _error(500, f"ctx profile unavailable: {type(exc).__name__}")
    return await off_loop(_profile_reply, payloads, fmt)  # built and serialized off the event loop


def _profile_reply(payloads: list[dict[str, Any]], fmt: str) -> Any:
    if fmt == names.FORMAT_STATE:
        out = served_state(payloads)
        return out if isinstance(out, Response) else _json(out)
    try:
        profile, texts = _served(payloads)
    except Exception as exc:  # noqa: BLE001
        logger.warning("sglang-ctxprof: /ctx_profile failed: %r", exc)
        return _error(500, f"ctx profile unavailable: {type(exc).__name__}")
    if not any("error" not in r for r in profile.ranks):
        return _error(503, "; ".join(r["error"] for r in profile.ranks) or "no scheduler answered",
                      degraded=profile.degraded)
    if fmt == "json":
        return served_json(profile, texts)  # the bytes of _json(profile.to_dict()), from kept texts
    from fastapi.responses import PlainTextResponse

    if fmt == "text":
        from .text import render

        return PlainTextResponse(render(profile))
    from .prometheus import render as render_prom

    if missing := [r["error"] for r in profile.ranks if "error" in r]:
        return _error(503, "not every rank answered: " + "; ".join(missing), degraded=profile.degraded)
    return PlainTextResponse(render_prom(profile), media_type="text/plain; version=0.0.4")


async def get_diagnosis(rc: ReadContext, request: Request):
    """The verdict (``views.diagnosis``) of the merged profile; ``?format=text``, ``?ctx=N`` (what-if)."""
    qp = dict(request.query_params)
    unknown = set(qp) - {"format", "ctx"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    fmt = qp.get("format", "json")
    if fmt not in ("json", "text"):
        return _error(400, f"unknown format {fmt!r}; use json or text")
    ctx = None
    if "ctx" in qp:
        try:
            ctx = int(qp["ctx"])
        except ValueError:
            return _error(400, f"ctx must be an integer number of tokens, got {qp['ctx'][:40]!r}")
        if not 0 <= ctx <= names.MAX_WHATIF_CTX:
            return _error(400, f"ctx must be between 0 and {names.MAX_WHATIF_CTX} tokens, got {qp['ctx'][:40]}")
    return await rc.gate.serve(("diagnosis", ctx, fmt),
                               lambda: _diagnosis_read(rc, ctx, fmt), standing=ctx is None)


async def _diagnosis_read(rc: ReadContext, ctx: Optional[int], fmt: str) -> Any:
    return await off_loop(_diagnosis_reply, await rc.snapshot(), rc.plain, ctx, fmt)


def _diagnosis_reply(payloads: list[dict[str, Any]], plain: PlainStore, ctx: Any, fmt: str) -> Any:
    from . import http_plain
    from .diagnosis import diagnose, evidence_from_profile

    profile = served_profile(payloads)
    if not any("error" not in r for r in profile.ranks):
        return _error(503, "; ".join(r["error"] for r in profile.ranks) or "no scheduler answered")
    ref = plain.ref
    d = diagnose(evidence_from_profile(profile, source="server"), ctx=ctx,
                 plain=ref.evidence if ref is not None else None)
    if not d["ledger"].get("available") and ref is None:
        d["ledger"]["reason"] = http_plain.reason(profile)
    if fmt == "json":
        return _json({"schema_version": names.SCHEMA_VERSION, **d})
    from fastapi.responses import PlainTextResponse

    from .diagnosis_text import render_text

    return PlainTextResponse(render_text(d))


async def _command(rc: ReadContext, request: Request, cmd: str, **args: Any):
    if request.query_params and not args:
        return _error(400, f"unexpected query parameter(s): {', '.join(sorted(request.query_params))}")
    try:
        payloads = await rc.ask(cmd, **args)
    except NoAnswer:
        raise  # a scheduler's, not ours: the guard's 504 (the command may still take effect)
    except Exception as exc:  # noqa: BLE001
        return _error(500, f"ctx profile command failed: {type(exc).__name__}")
    failed = command_failed(payloads)  # e.g. a clock a rank cannot use
    if failed is not None:
        return failed
    return {"ok": True, "command": cmd, "ranks": [p.get("status") for p in payloads]}


async def post_reset(rc: ReadContext, request: Request):
    """``?clock=wall|thread`` (optional): empty the profile and time the steps on that CPU clock from now on."""
    qp = dict(request.query_params)
    if set(qp) - {"clock"}:
        return _error(400, f"unexpected query parameter(s): {', '.join(sorted(set(qp) - {'clock'}))}")
    if "clock" in qp and qp["clock"] not in names.CLOCKS:
        return _error(400, f"clock must be one of {', '.join(names.CLOCKS)}, got {qp['clock'][:40]!r}")
    return await _command(rc, request, names.CMD_RESET, **qp)


async def post_enable(rc: ReadContext, request: Request):
    return await _command(rc, request, names.CMD_ENABLE)


async def post_disable(rc: ReadContext, request: Request):
    return await _command(rc, request, names.CMD_DISABLE)


async def get_status(rc: ReadContext, request: Request):
    if request.query_params:
        return _error(400, "this route takes no query parameters")
    payloads = await rc.ask(names.CMD_STATUS)
    return {"schema_version": names.SCHEMA_VERSION, "ranks": payloads}


async def get_requests(rc: ReadContext, request: Request):
    qp = dict(request.query_params)
    unknown = set(qp) - {"slowest", "steps", "rid"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    if "rid" in qp:  # one request, as /requests/{rid}
        return (await _request(rc, qp["rid"]) if len(qp) == 1
                else _error(400, "give either rid=RID or slowest=N, not both"))
    if qp.get("steps", "0") not in ("0", "1"):
        return _error(400, f"steps must be 0 or 1, got {qp['steps'][:40]!r}")
    raw = qp.get("slowest", str(DEFAULT_SLOWEST))
    try:
        n = int(raw)
    except ValueError:
        return _error(400, f"slowest must be an integer, got {raw[:40]!r}")
    if not 1 <= n <= MAX_SLOWEST:
        return _error(400, f"slowest must be between 1 and {MAX_SLOWEST}, got {n}")
    ask = {"slowest": n, **({"steps": True} if qp.get("steps") == "1" else {})}
    return await rc.gate.serve(("requests", n, "steps" in ask),
                               lambda: rc.read(names.CMD_REQUESTS, ask, _requests_reply, n),
                               standing="steps" not in ask and n in (DEFAULT_SLOWEST, PAGE_SLOWEST))


def _requests_reply(payloads: list[dict[str, Any]], n: int) -> Response:
    rows = [r for p in payloads for r in p.get("requests", [])]
    rows.sort(key=lambda r: r.get("decode_tok_s", 0.0))
    return _json({"schema_version": names.SCHEMA_VERSION, "requests": rows[:n]})


async def get_request(rc: ReadContext, request: Request):
    return await _request(rc, request.path_params.get("rid", ""))


async def _request(rc: ReadContext, rid: str):
    return await rc.request(rid, "request", _json)


async def post_fault(rc: ReadContext, request: Request):
    """Test-only runtime fault switch (installed only with ``SGLANG_CTXPROF_FAULT=runtime``)."""
    body, _ = await json_body(request, MAX_POLICY_BODY, "")
    comp = body.get("component") if isinstance(body, dict) else None
    if not isinstance(comp, str) or (comp and comp not in COMPONENTS):
        return _error(400, f'body must be {{"component": one of {", ".join(COMPONENTS)} or ""}}')
    g = guard()
    g.set_fault("http" if comp == "http" else "")
    reset_strikes()
    ranks = await rc.ask(names.CMD_FAULT, component="" if comp == "http" else comp)
    errors = [p["error"] for p in ranks if "error" in p]
    if errors:
        return _error(503, "; ".join(errors))
    return {"ok": True, "component": comp, "http": g.status(), "ranks": [p.get("status") for p in ranks]}


def routes(rc: ReadContext) -> list[Route]:
    """This module's routes, the live page's and (test only) the fault switch, bound to ``rc``."""
    from .ui import get_ui, get_ui_file

    def bound(h: Callable[..., Any]) -> Callable[[Request], Any]:
        return functools.partial(h, rc)

    out = [Route(names.ROUTE, bound(get_profile)),
           Route(names.ROUTE_RESET, bound(post_reset), "POST", admin=True),
           Route(names.ROUTE_ENABLE, bound(post_enable), "POST", admin=True),
           Route(names.ROUTE_DISABLE, bound(post_disable), "POST", admin=True),
           Route(names.ROUTE_STATUS, bound(get_status)), Route(names.ROUTE_REQUESTS, bound(get_requests)),
           Route(names.ROUTE_REQUESTS + "/{rid}", bound(get_request)),
           Route(names.ROUTE_DIAGNOSIS, bound(get_diagnosis)),
           Route(names.ROUTE_UI, get_ui), Route(names.ROUTE_UI + "/{name}", get_ui_file)]
    if guard().switchable:  # test only, never in production (see module docstring)
        out.append(Route(names.ROUTE_FAULT, bound(post_fault), "POST", admin=True, guarded=False))
    return out


def install_routes(app: Any, client: Asker, admin: Any, config: Optional[CtxProfConfig] = None) -> ReadContext:
    """Add the routes to SGLang's FastAPI ``app`` and return their read context.  ``client`` (a
    ControlClient) reaches the schedulers; ``admin`` wraps a write route in SGLang's ADMIN_OPTIONAL
    auth level (given by the wiring from the adapter, so this module imports nothing of SGLang's
    internals).  Installing again replaces the earlier install's routes (a new client wins)."""
    from . import http_capture, http_plain, http_trace

    uninstall_routes(app)
    rc = ReadContext(client=client, gate=gate(), config=config or CtxProfConfig.from_env())
    if any(getattr(r, "path", None) == names.ROUTE for r in app.router.routes):
        return rc  # someone else's route of that path: leave the app as it is
    before = {id(r) for r in app.router.routes}
    for r in routes(rc) + http_plain.routes(rc) + http_trace.routes(rc) + http_capture.routes(rc):
        endpoint = _guarded(r.handler) if r.guarded else _plain_endpoint(r.handler)
        app.add_api_route(r.path, admin(endpoint) if r.admin else endpoint, methods=[r.method])
    setattr(app.state, INSTALLED, [r for r in app.router.routes if id(r) not in before])
    return rc


def uninstall_routes(app: Any) -> None:
    """Remove the routes ``install_routes`` added to ``app`` (nothing else); a no-op when none."""
    added = getattr(app.state, INSTALLED, None)
    if not added:
        return
    gone = {id(r) for r in added}
    app.router.routes[:] = [r for r in app.router.routes if id(r) not in gone]
    setattr(app.state, INSTALLED, None)


def _plain_endpoint(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """An async function for FastAPI around a bound handler (a partial is not one)."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Any:
        return await handler(request)

    return endpoint
