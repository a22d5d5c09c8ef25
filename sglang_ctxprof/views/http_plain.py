"""The live server's plain-decode reference: what ``/ctx_profile/diagnosis`` puts its ledger against.

A server runs one arm: with speculation or without.  The speculation ledger ("is speculation paying
here?") needs the other arm measured on the same model, so the operator registers it: the
``/ctx_profile`` body of a plain server of the same model (live, or saved with
``diagnose --save`` / ``show --json``) is POSTed to ``/ctx_profile/plain``:

* ``POST /ctx_profile/plain[?source=NAME]`` (admin) - body: a plain server's ``/ctx_profile`` JSON.
  Refused with 400 when it is not a profile, holds no decode step, or holds speculative steps (it
  would not be plain decode), holds more than :data:`MAX_BUCKETS` buckets, or cannot be read as one
  (a field of the wrong type, a time, length or rate out of range); 413 above :data:`MAX_BODY`
  bytes.  Replaces any earlier reference.
* ``GET /ctx_profile/plain`` - what is registered (source, when, buckets and steps), or ``registered:
  false``.
* ``DELETE /ctx_profile/plain`` (admin) - forget it.

What is kept is only what the ledger reads (``plain_evidence``): per bucket its label, context,
tokens per step and phase times, each a float within what a server measures, checked once at
registration against every path of the ledger (a probe of speculative points at, between and far
beyond the reference's contexts), so a reference that was accepted cannot make a later diagnosis
fail.  The body is read on SGLang's event loop (at most :data:`MAX_BODY` bytes) and parsed there only
when small (``http_guard.json_body``); parsing a large one, reading it as a profile and checking it
run on the build thread (``http_build.off_loop``).

The reference lives in the HTTP process's memory (the read context's ``PlainStore``, one per
installed app, ``views.http_context``): a restart forgets it, ``/ctx_profile/reset`` does
not (it resets this server's own profile, not the other arm).  Without one, the diagnosis's ledger
is ``available: false`` with :func:`reason`, and the draft-budget advice keeps its assumed costs;
no number is invented.  Only timings and lengths are held, as in every profile.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Optional

from starlette.requests import Request

from ..model import names
from ..aggregate.ledger import HOST_GAP, ledger
from .diagnosis import Evidence, evidence_from_profile
from .diagnosis_evidence import Point, ledger_points
from .http_build import off_loop
from .http_context import PlainStore, ReadContext, Route
from .http_guard import error as _error, json_body
from .profile import Profile

MAX_BODY = 4 * 2**20  # bytes of a registered profile body (a server's is tens of kB)
MAX_BUCKETS = 256  # decode buckets of a registered profile
MAX_MS = 1e5  # the longest step or phase time a reference may hold (100 s)
MAX_AL = 1e3  # the most tokens per step
MAX_SOURCE = 200  # characters of ?source=
_SPEC = names.SPEC_PHASES


@dataclass(frozen=True)
class PlainReference:
    evidence: Evidence
    source: str
    registered_at: float  # unix seconds
    buckets: tuple[str, ...]
    steps: int


def reason(profile: Profile) -> str:
    """Why this server's diagnosis has no ledger (no step yet, no reference, or nothing speculative to
    weigh: no speculative phase recorded and no rank serving a speculative algorithm)."""
    if not any(b.steps for b in profile.buckets):
        return "no decode step recorded yet: the ledger weighs this server's decode steps against a plain reference"
    speculative = any(a != names.ALGORITHM_NONE for a in profile.algorithms)
    if not speculative and not any(p in b.phases for b in profile.buckets for p in _SPEC):
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
    if not src or len(src) > MAX_SOURCE or not src.isprintable():
        return _error(400, f"source must be 1-{MAX_SOURCE} printable characters")
    body, bad = await json_body(request, MAX_BODY, "body must be a /ctx_profile JSON body of a plain-decode server")
    if bad is not None:
        return bad
    if not isinstance(body, dict) or not isinstance(body.get("buckets"), list):
        return _error(400, "body must be a /ctx_profile JSON object (with \"buckets\") of a plain-decode server")
    if len(body["buckets"]) > MAX_BUCKETS:
        return _error(400, f"the profile holds {len(body['buckets'])} buckets; a reference takes at most {MAX_BUCKETS}")
    ref = await off_loop(_reference, body, src)
    if isinstance(ref, str):
        return _error(400, ref)
    store.ref = ref
    return {"ok": True, **_describe(ref)}


def _reference(body: dict, src: str) -> PlainReference | str:
    """``body`` as a plain reference, or why it cannot be one (every failure to read it is the
    body's: a 400, never a strike of the guard)."""
    try:
        profile = Profile.from_dict(body)
        why = check(profile)
        if why:
            return why
        ev = plain_evidence(evidence_from_profile(profile, source=f"plain reference: {src}"))
        for spec in _probe(ev):  # every path of the ledger that reads it, once here
            ledger(spec, ledger_points(ev))
    except Exception as exc:  # noqa: BLE001 - a malformed field of any kind (wrong type, missing key)
        return f"not a usable /ctx_profile body: {type(exc).__name__}: {str(exc)[:200]}"
    return PlainReference(ev, src, time.time(), tuple(b.label for b in profile.buckets if b.steps),
                          sum(b.steps for b in profile.buckets))


def _num(name: str, v: object, most: float) -> float:
    """A time, a length or a rate of the reference: a float in [0, ``most``], or ValueError naming it."""
    f = float(v)  # type: ignore[arg-type]
    if not (math.isfinite(f) and 0 <= f <= most):
        raise ValueError(f"{name} is {v!r}: not a number between 0 and {most:g}")
    return f


def plain_evidence(ev: Evidence) -> Evidence:
    """Only what the ledger reads of a plain reference (``diagnosis_evidence.ledger_points``), each
    number checked against what a server can measure: label, context (at most
    ``names.MAX_WHATIF_CTX`` tokens), tokens per step, step and phase times (at most
    :data:`MAX_MS`), and whether the bucket is thin (left out where solid ones exist, as offline)."""
    ctx = names.MAX_WHATIF_CTX
    pts = tuple(Point(str(p.label), _num("ctx", p.ctx, ctx), _num("ctx", p.ctx_sum, ctx), int(p.steps),
                      _num("al", p.al, MAX_AL), _num("step_ms", p.step_ms, MAX_MS),
                      {str(k): _num(str(k), v, MAX_MS) for k, v in p.phases.items()}, thin=p.thin is True)
                for p in ev.points)
    return Evidence(ev.source, pts, {})


def _probe(plain: Evidence) -> list[list[dict]]:
    """Speculative points that take each path of ``aggregate.ledger`` against ``plain``: at each of
    its contexts (by its label), between two of them, beyond both ends and as far as a context can
    be (interpolated and extrapolated, no label)."""
    ctxs = sorted({p.ctx for p in plain.points})
    at = [p.ctx for p in plain.points] + [c / 2 for c in ctxs[:1]] + [c * 2 + 1 for c in ctxs[-1:]]
    at += [0.0, float(names.MAX_WHATIF_CTX)]  # as far as a server's context can be from them
    at += [(a + b) / 2 for a, b in zip(ctxs, ctxs[1:])]
    labels = [p.label for p in plain.points] + [None] * (len(at) - len(plain.points))
    phases = {"step": 3.0, "draft": 1.0, "draft_extend": 0.2, "verify": 1.5, "verify_attn": 0.5,
              "verify_moe": 0.5, "overhead": 0.3, HOST_GAP: 0.1}
    rows = [{"ctx": c, "al": 2.0, "phases": phases, **({"label": lb} if lb is not None else {})}
            for c, lb in zip(at, labels)]
    return [rows, rows[:1]]


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
