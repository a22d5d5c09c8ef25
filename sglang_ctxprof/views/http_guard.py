"""The ``/ctx_profile`` routes' wrapper: fault guard, JSON serialization, and the write-Origin check.

* A handler's reply is serialized *inside* the guard, by :func:`json_response`: a non-finite float
  (JSON has none) becomes ``null`` instead of a bare 500 from Starlette after the handler returned.
* Bad input is the handler's job (a 4xx, never an exception).  An exception that still escapes is a
  failure of ours: the client gets a 500 JSON error with ``degraded``; one warning with the
  traceback is logged.  Only a repeated failure (:data:`STRIKES` in a row, with no success in
  between) disables the routes (503 from then on, until a restart or the test-only heal), so one
  odd request cannot switch the whole API off; one failure that several readers of a shared read
  receive counts once, and a client that hangs up mid-request counts not at all.
* A scheduler that does not answer a route's control command in time (``control.client.NoAnswer``)
  gets the client a 504 with what was waited for; it is no failure of ours (no strike).
* A request body is read by :func:`json_body`: at most a route's byte limit (413 above it, before
  reading the rest when ``Content-Length`` says so), and parsed to a 400 for anything that is not
  JSON, nests too deep for the parser (``RecursionError``) or holds ``NaN``/``Infinity``.
* A write (any method but GET/HEAD/OPTIONS) whose ``Origin`` header names another host than the one the
  request was sent to is refused with 403: SGLang allows CORS from any origin, and without a key
  (or with ``--tokenizer-worker-num > 1``, where SGLang installs no auth) a web page the operator
  opens could otherwise post to reset/disable/trace_policy.  So is one whose host is a name that is
  not this server's (an IP address, ``localhost``, this machine's name or one of
  ``SGLANG_CTXPROF_ALLOWED_HOSTS``): a page whose name was rebound to this server's address (DNS
  rebinding) is same-origin to it.  Clients that send no ``Origin`` (curl, scripts, the CLI) are
  unaffected.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import math
import re
import socket
import traceback
from itertools import accumulate
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..control.client import NoAnswer
from ..model import names
from ..model.config import CtxProfConfig
from ..model.guard import Guard
from .http_build import off_loop

logger = logging.getLogger(__name__)

STRIKES = 3  # consecutive internal failures of the routes before they are switched off
_STRUCK = "_ctxprof_struck"  # set on an exception once it counted (readers sharing a read share it)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
MAX_POLICY_BODY = 4096  # bytes of a trace-policy (or fault-switch) body: a few short fields
INLINE_BODY = 65536  # bytes of JSON parsed where the body arrives (the event loop); larger ones on the build thread
MAX_DEPTH = 32  # the deepest a body may nest (our saved results nest 10 at most): deeper is a 400
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")

_GUARD: Guard | None = None
_strikes = 0


def guard() -> Guard:
    """The HTTP process's own fault guard (component ``http``)."""
    global _GUARD
    if _GUARD is None:
        _GUARD = Guard(CtxProfConfig.from_env().fault)
    return _GUARD


def error(status: int, message: str, **extra: Any) -> Response:
    return json_response({"error": message, **extra}, status=status)


def command_failed(payloads: list[dict[str, Any]]) -> Response | None:
    """A 400 where a rank refused a command as bad input, a 503 where one could not run it, else None."""
    bad = [p["error"] for p in payloads if p.get("bad_request")]
    if bad:
        return error(400, "; ".join(bad))
    errors = [p["error"] for p in payloads if "error" in p]
    return error(503, "; ".join(errors)) if errors else None


def finite(obj: Any) -> Any:
    """``obj`` with every NaN/inf float replaced by None (JSON has no such numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_response(content: Any, status: int = 200) -> Response:
    """Serialize now (inside the guard), non-finite floats as null; the walk runs only when needed."""
    return Response(content=dumps(content).encode(), status_code=status, media_type="application/json")


def dumps(content: Any) -> str:
    """The compact JSON text of ``content`` (non-finite floats as null) that :func:`json_response` sends."""
    try:
        return json.dumps(content, allow_nan=False, separators=(",", ":"), default=_default)
    except ValueError:
        return json.dumps(finite(content), allow_nan=False, separators=(",", ":"), default=_default)


def _default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:40]} is past the largest float")
    return v


async def json_body(request: Request, limit: int, hint: str) -> tuple[Any, Response | None]:
    """The request's JSON body, or an error reply: 413 above ``limit`` bytes, 400 (``hint`` says
    what the route takes) for a body that is not strict JSON (a number too large for a float is
    not one either) or that the client stopped sending.  A body over ``INLINE_BODY`` bytes is parsed
    on the build thread (``off_loop``), not on the event loop SGLang's tokenizer manager runs on."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        return None, error(413, f"body is {declared[:20]} bytes; this route takes at most {limit}")
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                return None, error(413, f"body is over {limit} bytes, the most this route takes")
            chunks.append(chunk)
    except ClientDisconnect:  # the client hung up mid-body: its doing, not a failure of ours
        return None, error(400, "the client disconnected before sending the whole body")
    raw = b"".join(chunks)
    try:
        if len(raw) <= INLINE_BODY:
            return _parse(raw), None
        return await off_loop(_parse, raw), None  # MBs: not on the loop that runs the tokenizer
    except (ValueError, RecursionError) as exc:
        return None, error(400, f"{hint} ({type(exc).__name__}: {str(exc)[:80]})")


def _parse(raw: bytes) -> Any:
    """Strict JSON nested ``MAX_DEPTH`` deep at most (the control command that carries a body nests it
    deeper, where ``json.dumps`` would recurse past Python's limit) in strict UTF-8 whose strings are
    all text: a lone surrogate (encoded in the bytes, or a ``\\ud800`` escape) is a string no UTF-8
    carries, which fails where a reply naming it is encoded (SGLang's msgpack IPC, in the scheduler).
    UnicodeError is a ValueError."""
    text = raw.decode("utf-8")  # json.loads on bytes would take UTF-16 and encoded surrogates
    obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    # the nesting outside the strings, scanned in C, only over text the parser took (in an unterminated
    # string the string pattern would rescan the rest of the text from each quote after it)
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    if max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")  # re-encoded deeper still, it would recurse
    if "\\u" in text:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return obj


_HOSTS: frozenset[str] | None = None  # own_hosts(), worked out at the first browser write


def own_hosts() -> frozenset[str]:
    """The host names a browser's write may come through besides an IP address: ``localhost``, this
    machine's name, and those ``SGLANG_CTXPROF_ALLOWED_HOSTS`` adds (no DNS lookup)."""
    global _HOSTS
    if _HOSTS is None:
        _HOSTS = frozenset({"localhost", socket.gethostname().lower(), *CtxProfConfig.from_env().allowed_hosts})
    return _HOSTS


def _own_name(hostname: str) -> bool:
    try:
        ipaddress.ip_address(hostname)
        return True
    except ValueError:
        return hostname in own_hosts()


def foreign_origin(request: Request) -> str | None:
    """The ``Origin`` of a write a browser sent from another origin, or through a name that is not
    this server's (DNS rebinding: a page whose name now resolves here is same-origin to it), or None
    when the write may pass (no ``Origin``: not a browser's)."""
    if request.method in SAFE_METHODS:
        return None
    origin = request.headers.get("origin")
    if origin is None:
        return None
    host = (request.headers.get("host") or "").lower()
    try:
        parts = urlsplit(origin)
        same = (parts.scheme in ("http", "https") and parts.netloc.lower() == host and bool(host)
                and _own_name((parts.hostname or "").lower()))
    except ValueError:
        same = False
    return None if same else origin


def guarded(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
    """Run one of our handlers under the ``http`` guard: never a bare 500, never a traceback out."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        global _strikes
        g = guard()
        if not g.ok("http"):
            return error(503, "ctx profile endpoint disabled after repeated failures", degraded=[g.status()])
        bad_origin = foreign_origin(request)
        if bad_origin is not None:
            return error(403, f"cross-origin write refused (Origin {bad_origin[:80]!r} is not this server by an "
                              f"address or one of its names; {names.ENV_ALLOWED_HOSTS} adds names)")
        try:
            out = await handler(request)
            if not isinstance(out, Response):
                out = json_response(out)
        except NoAnswer as exc:  # a scheduler's, not ours: no strike
            return error(504, str(exc))
        except ClientDisconnect:  # the client hung up: nobody to answer, nothing of ours failed
            return error(400, "the client disconnected")
        except Exception as exc:  # noqa: BLE001 - our failure must not look like SGLang's
            reason = f"{type(exc).__name__}: {exc}"
            if not getattr(exc, _STRUCK, False):  # one failure shared by several readers counts once
                _strikes += 1
                if _strikes >= STRIKES:
                    g.fail("http", exc)
                else:
                    logger.warning("sglang-ctxprof: %s %s failed (%d of %d before the routes switch off):\n%s",
                                   request.method, request.url.path, _strikes, STRIKES,
                                   "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, _STRUCK, True)
            return error(500, f"ctx profile failed: {type(exc).__name__}",
                         degraded=[g.status() or {"components": {"http": f"{reason} ({_strikes} of {STRIKES})"}}])
        _strikes = 0
        return out

    return endpoint


def reset_strikes() -> None:
    """Forget earlier failures (the test-only heal)."""
    global _strikes
    _strikes = 0
