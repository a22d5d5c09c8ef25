"""The live server's plain-decode reference: what ``/ctx_profile/diagnosis`` puts its ledger against.

A server runs one arm: with speculation or without.  The speculation ledger ("is speculation paying
here?") needs the other arm measured on the same model, so the operator registers it: the
``/ctx_profile`` body of a plain server of the same model (live, or saved with
``diagnose --save`` / ``show --json``) is POSTed to ``/ctx_profile/plain``:

* ``POST /ctx_profile/plain[?source=NAME]`` (admin) - body: a plain server's ``/ctx_profile`` JSON.
  Refused with 400 when it is not a profile, holds no decode step, or holds speculative steps (it
  would not be plain decode) or cannot be read as one (a field of the wrong type); 413 above
  :data:`MAX_BODY` bytes.  Replaces any earlier reference.
* ``GET /ctx_profile/plain`` - what is registered (source, when, buckets and steps), or ``registered:
  false``.
* ``DELETE /ctx_profile/plain`` (admin) - forget it.

The reference lives in the HTTP process's memory (the read context's ``PlainStore``, one per
installed app, ``views.http_context``): a restart forgets it, ``/ctx_profile/reset`` does
not (it resets this server's own profile, not the other arm).  Without one, the diagnosis's ledger
is ``available: false`` with :func:`reason`, and the draft-budget advice keeps its assumed costs;
no number is invented.  Only timings and lengths are held, as in every profile.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Optional

from starlette.requests import Request

from ..model import names
from ..model.names import Phase
from .diagnosis import Evidence, diagnose, evidence_from_profile
from .http_context import PlainStore, ReadContext, Route
from .http_guard import error as _error, json_body
from .profile import Profile

MAX_BODY = 16 * 2**20  # bytes of a registered profile body
MAX_SOURCE = 200  # characters of ?source=
_SPEC = (Phase.VERIFY.value, Phase.DRAFT.value)


@dataclass(frozen=True)
class PlainReference:
    evidence: Evidence
    source: str
    registered_at: float  # unix seconds
    buckets: tuple[str, ...]
    steps: int


def reason(profile: Profile) -> str:
    """Why this server's diagnosis has no ledger (no reference, or nothing speculative to weigh)."""
    if not any(p in b.phases for b in profile.buckets for p in _SPEC):
        return ("this server decodes without speculation (no draft or verify step recorded): it has no ledger "
                "of its own; POST its /ctx_profile to a speculative server's /ctx_profile/plain as that "
                "server's plain reference")
    return ("no plain-decode reference registered: this server runs speculation only, so plain decode at the "
            "same context is unmeasured here; POST a plain server's /ctx_profile body (same model, no "
            "--speculative-* flags) to /ctx_profile/plain, or run `sglang-ctxprof diagnose --plain`; "
            "costs per draft position stay assumed")


def check(profile: Profile) -> Optional[str]:
    """Why ``profile`` cannot be a plain reference, or None."""
    if not any(b.steps for b in profile.buckets):
        return "the profile holds no decode step: run some requests on the plain server first"
    spec = sorted({p for b in profile.buckets for p in _SPEC if p in b.phases})
    algs = [a for a in profile.algorithms if a != names.ALGORITHM_NONE]
    if spec or algs:
        what = ", ".join(algs) or ", ".join(spec) + " phases"
        return (f"the profile holds speculative steps ({what}): the reference must come from a server "
                f"without speculation")
    return None


def routes(rc: ReadContext) -> list[Route]:
    """The plain reference's routes, on ``rc``'s store."""
    return [Route(names.ROUTE_PLAIN, functools.partial(get_plain, rc.plain)),
            Route(names.ROUTE_PLAIN, functools.partial(post_plain, rc.plain), "POST", admin=True),
            Route(names.ROUTE_PLAIN, functools.partial(delete_plain, rc.plain), "DELETE", admin=True)]


async def post_plain(store: PlainStore, request: Request):
    qp = dict(request.query_params)
    unknown = set(qp) - {"source"}
    if unknown:
        return _error(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
    src = qp.get("source", "registered plain profile")
    if not src or len(src) > MAX_SOURCE:
        return _error(400, f"source must be 1-{MAX_SOURCE} characters")
    body, bad = await json_body(request, MAX_BODY, "body must be a /ctx_profile JSON body of a plain-decode server")
    if bad is not None:
        return bad
    if not isinstance(body, dict) or "buckets" not in body:
        return _error(400, "body must be a /ctx_profile JSON object (with \"buckets\") of a plain-decode server")
    try:  # every failure to read the body as a profile is the body's: a 400, never a strike of the guard
        profile = Profile.from_dict(body)
        why = check(profile)
        if why:
            return _error(400, why)
        ev = evidence_from_profile(profile, source=f"plain reference: {src}")
        diagnose(ev, plain=ev)  # every path of a diagnosis that reads it, once here: it cannot fail there
    except Exception as exc:  # noqa: BLE001 - a malformed field of any kind (wrong type, missing key)
        return _error(400, f"not a usable /ctx_profile body: {type(exc).__name__}: {str(exc)[:200]}")
    store.ref = PlainReference(ev, src, time.time(), tuple(b.label for b in profile.buckets if b.steps),
                               sum(b.steps for b in profile.buckets))
    return {"ok": True, **_describe(store.ref)}


async def get_plain(store: PlainStore, request: Request):
    if request.query_params:
        return _error(400, "this route takes no query parameters")
    return _describe(store.ref)


async def delete_plain(store: PlainStore, request: Request):
    if request.query_params:
        return _error(400, "this route takes no query parameters")
    had, store.ref = store.ref is not None, None
    return {"ok": True, "removed": had}


def _describe(ref: Optional[PlainReference]) -> dict:
    if ref is None:
        return {"schema_version": names.SCHEMA_VERSION, "registered": False}
    return {"schema_version": names.SCHEMA_VERSION, "registered": True, "source": ref.source,
            "registered_at": ref.registered_at, "buckets": list(ref.buckets), "steps": ref.steps}
