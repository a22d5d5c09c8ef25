"""``sglang-ctxprof trace --url URL [RID | --slowest N]``: one request's story, step by step.

Fetches ``/ctx_profile/requests/{rid}`` (or ``?slowest=N``) and prints, per request, a header
(prompt tokens, steps, tokens, acceptance, decode tok/s, context, deep captures) and a table with one
row per decode step: context length, batch size, draft/accepted/committed tokens, the step time and
its phases, each present in a shown step: draft, verify and its attention / MoE / rest, draft_extend,
a plain step's decode and its split, and the remainder (overhead, unattributed).  ``--json`` prints
the raw answer.  An answer of another shape (not this version's) is one line.  No tracing backend
needed.

``--perfetto out.json`` instead writes Chrome trace events (``GET /ctx_profile/trace.json``): the last
``--last N`` steps of every rank (default 256, at most 2048: what each rank keeps; at a large batch its
newest up to ``names.MAX_TRACE_ROWS`` request rows, the rest counted), or with a RID that
request's prefill and steps, for ui.perfetto.dev or chrome://tracing.  The file is written whole or
not at all (a failed write leaves what was there).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..aggregate.request_entry import rows_not_kept
from ..model import names
from ..model.names import Phase
from .main import printable, write_atomic

COLS = (("#", 4), ("step_id", 8), ("ctx", 7), ("bs", 3), ("draft", 5), ("acc", 4), ("com", 4), ("step_ms", 9))
# (phase, column): shown when a shown step has the phase; "other" (overhead + unattributed) always
PHASE_COLS = tuple((p.value, name) for p, name in (
    (Phase.DRAFT, "draft"), (Phase.VERIFY, "verify"), (Phase.VERIFY_ATTN, "v.attn"), (Phase.VERIFY_MOE, "v.moe"),
    (Phase.VERIFY_REST, "v.rest"), (Phase.DRAFT_EXTEND, "d_ext"), (Phase.DECODE, "decode"),
    (Phase.DECODE_ATTN, "dec.attn"), (Phase.DECODE_MOE, "dec.moe"), (Phase.DECODE_REST, "dec.rest")))
ODD = (KeyError, TypeError, AttributeError, ValueError, IndexError)  # an answer of another shape


def add_cli_args(ap) -> None:
    ap.add_argument("rid", nargs="?", default=None, help="request id (meta_info.id); omit with --slowest")
    ap.add_argument("--slowest", type=int, default=None, metavar="N",
                    help="the N recent requests with the lowest decode tok/s (default when no RID: 1)")
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    ap.add_argument("--max-steps", type=int, default=0, metavar="K",
                    help="print at most K step rows per request (0: all)")
    ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")
    ap.add_argument("--perfetto", default=None, metavar="OUT.json",
                    help="write Chrome trace events (ui.perfetto.dev, chrome://tracing) to this file")
    ap.add_argument("--last", type=int, default=None, metavar="N",
                    help=f"with --perfetto: the last N steps per rank (default {names.DEFAULT_TRACE_STEPS}, "
                         f"at most {names.MAX_TRACE_STEPS})")


def perfetto(ns) -> int:
    """Fetch ``/ctx_profile/trace.json`` and write it to ``ns.perfetto``."""
    import urllib.parse

    from ..model.rids import valid_rid
    from .client import ClientError, ServerClient
    from .main import CliError

    if ns.slowest is not None:
        raise CliError("--perfetto takes a RID or --last N, not --slowest")
    if ns.rid is not None and ns.last is not None:
        raise CliError("give either a RID or --last N, not both")
    client = ServerClient(ns.url, ns.api_key, timeout=120)
    if ns.rid is not None:
        if not valid_rid(ns.rid):
            raise ClientError(names.RID_MALFORMED)
        query = "rid=" + urllib.parse.quote(ns.rid, safe="")
    else:
        n = names.DEFAULT_TRACE_STEPS if ns.last is None else ns.last
        if not 1 <= n <= names.MAX_TRACE_STEPS:
            raise CliError(f"--last must be between 1 and {names.MAX_TRACE_STEPS}, got {n}")
        query = f"last={n}"
    body = client._require(f"{names.ROUTE_TRACE_JSON}?{query}")
    try:
        ev = body["traceEvents"]
        steps = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in ("decode", "prefill"))
    except ODD as exc:
        raise _odd(ns, exc) from None
    write_atomic(ns.perfetto, json.dumps(body))
    other = body.get("otherData") if isinstance(body, dict) else None
    left = other.get("steps_left_out") if isinstance(other, dict) else None
    print(f"wrote {len(ev)} trace events ({steps} steps and prefill batches) to {ns.perfetto}; "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    if type(left) is int and left > 0:
        print(f"{left} older step(s) left out: a read sends each rank's newest steps up to "
              f"{names.MAX_TRACE_ROWS} request rows")
    return 0


def fetch(ns) -> list[dict[str, Any]]:
    from .client import ServerClient
    from .main import CliError

    if ns.rid is not None and ns.slowest is not None:
        raise CliError("give either a RID or --slowest N, not both")
    client = ServerClient(ns.url, ns.api_key, timeout=60)
    if ns.rid is not None:
        return [client.require_request(ns.rid)]
    return client.require_slowest(1 if ns.slowest is None else ns.slowest)


def _f(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{float(v):.{nd}f}"


def render_request(r: Mapping[str, Any], max_steps: int = 0) -> str:
    def v(key: str) -> Any:  # a partial request's prompt and contexts are not known yet
        return "-" if r.get(key) is None else r[key]

    out = [f"request {printable(r['rid'])}",
           f"  prompt {v('prompt_tokens')} tokens, prefill {_f(r.get('prefill_ms'))} ms; "
           f"{r.get('steps', 0)} decode steps, {r.get('committed', 0)} tokens committed "
           f"({r.get('accepted', 0)} accepted), {_f(r.get('accepted_per_step'))} accepted/step, "
           f"{_f(r.get('decode_tok_s'), 1)} tok/s over {_f(r.get('decode_ms'))} ms; "
           f"ctx {v('ctx_first')} -> {v('ctx_last')}; finished={r.get('finished')}"]
    if r.get("trace_parent"):
        out.append(f"  trace: {printable(r['trace_parent'])}")
    for c in r.get("captures") or ():
        out.append(f"  deep capture {printable(str(c['id']))} ({printable(str(c['trigger']))}, "
                   f"{printable(str(c['state']))}): steps {c['step_ids']} -> {printable(str(c.get('path')))}")
    if r.get("waterfall"):
        out += render_waterfall(r["waterfall"])
    rows = list(r.get("step_rows") or [])
    lost = rows_not_kept(r)
    if lost:
        out.append(f"  ({lost} step rows not kept: per-request or global row budget)")
    if r.get("step_rows_left_out"):
        out.append(f"  ({int(r['step_rows_left_out'])} step rows left out of this read, past its budget: "
                   f"sglang-ctxprof trace {printable(r['rid'])} shows them)")
    shown = rows if max_steps <= 0 else rows[:max_steps]
    phases = [(p, name) for p, name in PHASE_COLS if any(p in (s.get("phases_ms") or {}) for s in shown)]
    cols = COLS + tuple((name, 8) for _, name in phases) + (("other", 8),)
    out.append("  " + " ".join(f"{name:>{w}}" for name, w in cols))
    for k, s in enumerate(shown):
        ph = s.get("phases_ms") or {}
        other = float(ph.get("overhead") or 0.0) + float(ph.get("unattributed") or 0.0)
        vals = [k + 1, s["step_id"], s["ctx_len"], s["batch_size"], s["draft_tokens"], s["accepted"],
                s["committed"], _f(s["step_ms"], 3)] + [_f(ph.get(p), 3) if p in ph else "-" for p, _ in phases] \
            + [_f(other, 3)]
        out.append("  " + " ".join(f"{str(v):>{w}}" for v, (_, w) in zip(vals, cols)))
    if len(shown) < len(rows):
        out.append(f"  ... {len(rows) - len(shown)} more steps (--max-steps 0 shows all)")
    return "\n".join(out) + "\n"


def render_waterfall(w: Mapping[str, Any]) -> list[str]:
    """Where the request's decode wall time went; the parts add up to the wall time."""
    wall = float(w["wall_ms"]) or 1.0

    def line(name: str, ms: float) -> str:
        return f"    {name:<28} {ms:10.2f} ms  {100 * ms / wall:5.1f}%"

    out = [f"  wall time {w['wall_ms']:.2f} ms from its first decode step to its last:"]
    for p, ms in sorted((w.get("own_steps_ms") or {}).items(), key=lambda kv: -kv[1]):
        out.append(line(f"own steps: {p}", ms))
    share = w.get("batch_sharing_ms")
    out.append("      of which batch sharing: " + ("unavailable (no batch-1 step in the same bucket)"
                                                     if share is None else f"{share:.2f} ms"))
    out.append(line("other requests' prefill", w.get("others_prefill_ms", 0.0)))
    out.append(line("other decode steps", w.get("other_decode_ms", 0.0)))
    out.append(line("host gaps (scheduler)", w.get("host_gaps_ms", 0.0)))
    out.append(line("unaccounted", w.get("unaccounted_ms", 0.0)))
    return out


def run(ns) -> int:
    if ns.perfetto:
        return perfetto(ns)
    if ns.last is not None:
        from .main import CliError

        raise CliError("--last goes with --perfetto")
    try:
        reqs = fetch(ns)
        if ns.json:
            print(json.dumps(reqs if ns.rid is None else reqs[0], indent=2))
            return 0
        if not reqs:
            print("no finished decode requests in the recent-request ring yet")
            return 0
        text = [render_request(r, ns.max_steps) for r in reqs]
    except ODD as exc:
        raise _odd(ns, exc) from None
    print("times in ms; phases are per step (the whole batch); other = overhead/unattributed")
    for t in text:
        print(t)
    return 0


def _odd(ns, exc: Exception) -> Exception:
    from .main import CliError

    return CliError(f"{ns.url} answered a request record of another shape ({type(exc).__name__}: "
                    f"{printable(str(exc)[:80])}): another version of sglang-ctxprof?")
