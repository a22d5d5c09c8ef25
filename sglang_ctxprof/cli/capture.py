"""``sglang-ctxprof capture --url URL [--rid RID] [--steps N] [--wait-s S]``: take one deep capture and
fetch it; ``--cancel [ID]``: cancel the pending or running one (only ID's, with an id).

Asks ``POST /ctx_profile/capture`` (admin level: ``--admin-key``), waits until the capture is done
(``/ctx_profile/status``; a 504, a scheduler late with its answer, is asked again until
``--timeout``), then writes the trace SGLang's profiler exported (``<id>.trace.json.gz``)
and the merged timeline (``<id>.timeline.json``: the trace with ctxprof's step slices, for
ui.perfetto.dev or chrome://tracing) into ``--out``.  A refusal (the budget's cooling-off, a
capture already running) or a failure is one line and a non-zero exit, and so are an answer of
another shape (not SGLang, another version) and a capture id that could name a file outside
``--out`` (the server chooses it).  A timeline the server will not give (over its size bound, a
full read queue) leaves the saved trace: a line says why, exit 0.  The capture is asked with
``--admin-key``, or with ``--api-key`` where no admin key is given (SGLang then asks for that one).
A capture not started within ``--wait-s`` (the server's default: 60 s) fails on the server; one the
command stops waiting for (``--timeout``, or Ctrl-C) is cancelled on the server before it exits.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..model import names
from .client import CAPTURE_ID_RE  # what the server's capture route accepts for an id: no "/", URL-safe
from .main import printable, write_atomic


def add_cli_args(ap) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--rid", default=None, help="capture this request's next steps")
    ap.add_argument("--steps", type=int, default=None, help="steps to capture (default: the server's)")
    ap.add_argument("--wait-s", type=float, default=None,
                    help="fail a capture not started within this many seconds (default: the server's, 60)")
    ap.add_argument("--cancel", nargs="?", const="", default=None, metavar="ID",
                    help="cancel the pending or running capture (only capture ID's, if given), then exit")
    ap.add_argument("--admin-key", default=None,
                    help="bearer token if the server uses --admin-api-key (else --api-key is sent)")
    ap.add_argument("--api-key", default=None, help="bearer token for read routes (--api-key)")
    ap.add_argument("--out", default=".", help="folder for the trace and the merged timeline")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the capture")


def _call(ns, method: str, path: str, key: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(ns.url.rstrip("/") + path, method=method, data=b"" if method == "POST" else None)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        from .main import CliError

        raise CliError(f"cannot reach {ns.url}: {getattr(exc, 'reason', exc)}") from None


def _body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw[:200].decode(errors="replace")}


def _json(ns, status: int, raw: bytes, what: str) -> dict[str, Any]:
    from .main import CliError

    body = _body(raw)
    if status == 404:
        raise CliError(f"{what}: the server has no {names.ROUTE_CAPTURE} route: start SGLang with "
                       f"{names.CLI_FLAG} (HTTP 404)")
    if status != 200:
        raise CliError(f"{what}: HTTP {status}: {_why(body)}")
    if not _answered(body):
        raise CliError(f"{what}: {ns.url} did not answer a JSON object: is it SGLang with {names.CLI_FLAG}?")
    return body


def _answered(body: Any) -> bool:
    """Whether ``body`` is a JSON object the server sent (``_body`` makes an unreadable one an error)."""
    return isinstance(body, dict) and set(body) != {"error"}


def _why(body: Any) -> str:
    return printable(str(body.get("error", body) if isinstance(body, dict) else body)[:200])


def _find(status: dict[str, Any], cid: str) -> Any:
    """Capture ``cid``'s record in a status answer; None when absent or of another shape."""
    try:
        caps = [c for r in status.get("ranks") or []
                for c in ((r.get("status") or {}).get("capture") or {}).get("captures") or []]
        return next((c for c in caps if c.get("id") == cid), None)
    except (AttributeError, TypeError):
        return None


def cancel(ns, cid: str) -> dict[str, Any]:
    """Cancel the pending or running capture (``cid``: only that one); its record (rank 0's)."""
    from .main import CliError

    path = names.ROUTE_CAPTURE_CANCEL + (f"?id={urllib.parse.quote(cid)}" if cid else "")
    status, raw = _call(ns, "POST", path, ns.admin_key or ns.api_key)
    body = _body(raw)
    if status == 404 and isinstance(body, dict) and "cancelled" in body:  # nothing to cancel (no route: _json)
        raise CliError(f"nothing cancelled: {_why(body)}")
    done = _json(ns, status, raw, "cancel refused").get("cancelled")
    if not (isinstance(done, list) and done and isinstance(done[0], dict)):
        raise CliError(f"cancel: the server's answer names no capture: {printable(str(done)[:200])}")
    return done[0]


def run(ns) -> int:
    from .main import CliError

    if ns.cancel is not None:
        info = cancel(ns, ns.cancel)
        print(f"capture {printable(str(info.get('id')))} cancelled: {printable(str(info.get('state')))}, "
              f"steps {info.get('step_ids')}")
        return 0
    q = {k: v for k, v in (("rid", ns.rid), ("steps", ns.steps), ("wait_s", ns.wait_s)) if v is not None}
    path = names.ROUTE_CAPTURE + ("?" + urllib.parse.urlencode(q) if q else "")
    body = _json(ns, *_call(ns, "POST", path, ns.admin_key or ns.api_key), "capture refused")
    caps = body.get("captures")
    if not (isinstance(caps, list) and caps and isinstance(caps[0], dict) and caps[0].get("id") is not None):
        raise CliError(f"capture: the server's answer names no capture: {printable(str(body)[:200])}")
    cid = str(caps[0]["id"])
    if not CAPTURE_ID_RE.match(cid):  # it names a file under --out and goes into URLs: the server's word only
        raise CliError(f"the server named its capture {printable(cid[:80])!s}: not a capture id")
    print(f"capture {cid} accepted; waiting for it ...", flush=True)
    try:
        info = _wait(ns, cid)
    except (CliError, KeyboardInterrupt):
        # what the command no longer waits for must not hold the server's one capture (each DP
        # group's: their ids may differ)
        for own in dict.fromkeys(str(c.get("id")) for c in caps if isinstance(c, dict)):
            if not CAPTURE_ID_RE.match(own):
                continue
            try:
                cancel(ns, own)
                print(f"capture {own} cancelled on the server", flush=True)
            except CliError:
                pass  # it ended meanwhile, or the server cannot be reached: the error itself says why
        raise
    if info["state"] != names.CAPTURE_DONE:
        raise CliError(f"capture {cid} {info['state']}: {printable(str(info.get('error')))}")
    os.makedirs(ns.out, exist_ok=True)
    status, raw = _call(ns, "GET", f"{names.ROUTE_CAPTURE}/{cid}?format=trace", ns.api_key)
    trace = os.path.join(ns.out, f"{cid}.trace.json.gz")
    if status == 200:
        write_atomic(trace, raw)
    else:
        trace = f"{printable(str(info.get('path')))} (on the server's host)"
    print(f"{printable(str(info.get('trigger')))} capture {cid}: steps {info.get('step_ids')}, {info.get('bytes')} "
          f"bytes, export {_ms(info.get('export_ms'), 0)} ms off the scheduler thread "
          f"(stop {_ms(info.get('stop_ms'), 1)} ms on it)")
    print(f"trace: {trace}", flush=True)
    status, raw = _call(ns, "GET", f"{names.ROUTE_CAPTURE}/{cid}?format=timeline", ns.api_key)
    tl = _body(raw)
    if status != 200 or not _answered(tl):
        print(f"merged timeline: not written (HTTP {status}: {_why(tl)})")
        return 0
    tl_path = os.path.join(ns.out, f"{cid}.timeline.json")
    write_atomic(tl_path, json.dumps(tl))
    clock = (tl.get("otherData") or {}).get("clock") or {}
    print(f"merged timeline: {tl_path} (clocks aligned on {clock.get('aligned_on')}, "
          f"+- {_ms((clock.get('error_bound_ns') or 0) / 1e3, 0)} us); open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _wait(ns, cid: str) -> dict[str, Any]:
    """Capture ``cid``'s record once done, failed or deleted (``/ctx_profile/status``); CliError at
    ``--timeout``."""
    from .main import CliError

    t0 = time.time()
    info, late = None, None
    while True:
        status, raw = _call(ns, "GET", names.ROUTE_STATUS, ns.api_key)
        if status == 504:  # a scheduler late with its answer (or that command still out): ask again
            late = _why(_body(raw))
        else:
            info, late = _find(_json(ns, status, raw, "status"), cid), None
            if info is not None and info.get("state") in (names.CAPTURE_DONE, names.CAPTURE_FAILED,
                                                          names.CAPTURE_DELETED):
                return info
        if time.time() - t0 > ns.timeout:
            why = f"the last status answer: HTTP 504: {late}" if late else f"state {info and info.get('state')}"
            raise CliError(f"capture {cid} not done after {ns.timeout:g} s ({why})")
        time.sleep(0.5)


def _ms(v: Any, nd: int) -> str:
    return f"{v:.{nd}f}" if isinstance(v, (int, float)) else "?"
