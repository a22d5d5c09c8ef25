"""Chrome trace-event JSON of recorded steps: what ``ui.perfetto.dev`` and ``chrome://tracing`` open.

:func:`steps_trace` lays out the last step records of each rank (``GET /ctx_profile/trace.json?last=N``,
at most ``MAX_TRACE_STEPS`` per rank, the ring each rank keeps) and :func:`request_trace` one request's
prefill and decode steps (``?rid=``).  The layout:

* one process ``sglang-ctxprof``; one track (thread) per rank, named by its rank label
  (``tp0-dp0-pp0``), or, for one request, a ``steps`` track and a ``request`` track;
* one complete event (``"ph": "X"``) per step: ``decode step`` (cat ``decode``) or ``prefill``
  (cat ``prefill``), with context and batch size as ``args`` (plus ids, token counts, timing mode);
* inside each decode step its phases, in execution order: ``draft``, ``verify`` (holding
  ``verify_attn``, ``verify_moe``, ``verify_rest``), ``draft_extend``, ``overhead``, ``unattributed``,
  laid out by ``model.layout`` (the OTel spans use the same layout);
* ``ts``/``dur`` are microseconds from the earliest step shown (``otherData.t0_ns`` holds it).

Only ids, lengths and timings are written: never prompt or output text.  Pure.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..aggregate.request_entry import rows_not_kept
from ..model import layout
from ..model.names import CACHED_TOKENS, KIND_DECODE, MAX_TRACE_ROWS, MAX_TRACE_STEPS
from ..model.records import accepted_drafts, prompt_rows, step_end_ns

PID = 1
PROCESS = "sglang-ctxprof"
LAYOUT_NOTE = layout.NOTE


def _x(name: str, cat: str, tid: int, start_ns: int, end_ns: int, t0: int, args: Mapping[str, Any] | None = None):
    ev: dict[str, Any] = {"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid,
                          "ts": (start_ns - t0) / 1e3, "dur": (end_ns - start_ns) / 1e3}
    if args:
        ev["args"] = dict(args)
    return ev


def _meta(tid: int, name: str, sort: int) -> list[dict[str, Any]]:
    return [{"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": sort}}]


def phase_events(phases: Mapping[str, float], start_ns: int, end_ns: int, tid: int, t0: int) -> list[dict[str, Any]]:
    """The phase slices of one step (``model.layout``: back to back, tiling [start_ns, end_ns) when
    the leaf phases add up to the step)."""
    return [_x(s.name, "phase", tid, s.start_ns, s.end_ns, t0) for s in layout.lay_phases(phases, start_ns, end_ns)]


def _step_args(rec: Mapping[str, Any]) -> dict[str, Any]:
    ctx = [int(c) for c in rec.get("ctx_lens") or ()]
    acc = [int(a) for a in rec.get("accepted") or ()]
    com = [int(c) for c in rec.get("committed") or ()]
    return {"step_id": int(rec.get("step_id", 0)), "batch_size": len(ctx),
            "ctx_mean": round(sum(ctx) / len(ctx), 1) if ctx else 0.0, "ctx_sum": sum(ctx),
            "ctx_min": min(ctx, default=0), "ctx_max": max(ctx, default=0),
            "draft_tokens": int(rec.get("draft_tokens", 0)), "accepted": sum(acc), "committed": sum(com),
            "accepted_drafts": sum(accepted_drafts(a, int(rec.get("non_draft_tokens") or 1)) for a in acc),
            "step_ms": float(rec.get("step_ms", 0.0)), "algorithm": rec.get("algorithm", ""),
            "timing": rec.get("timing", ""), "rids": list(rec.get("rids") or ())}


def record_slices(rec: Mapping[str, Any]) -> list[tuple[str, str, int, int, dict[str, Any] | None]]:
    """One step row's slices as (name, cat, start_ns, end_ns, args): the step, then its phases."""
    start = int(rec.get("t_start_ns", 0))
    end = step_end_ns(start, rec.get("step_ms", 0.0))
    if rec.get("kind", KIND_DECODE) != KIND_DECODE:
        args = _step_args(rec)
        del args["ctx_sum"]
        args["prompt_tokens"] = sum(prompt_rows(rec.get("ctx_lens") or (), rec.get("accepted") or ()))
        args[CACHED_TOKENS] = sum(int(c) for c in rec.get("cached_lens") or ())
        return [("prefill", "prefill", start, end, args)]
    return [("decode step", "decode", start, end, _step_args(rec))] + \
        [(s.name, "phase", s.start_ns, s.end_ns, None) for s in layout.lay_phases(rec.get("phases_ms") or {}, start, end)]


def _record_events(rec: Mapping[str, Any], tid: int, t0: int) -> list[dict[str, Any]]:
    return [_x(name, cat, tid, s, e, t0, args) for name, cat, s, e, args in record_slices(rec)]


def _rank_label(rank: Any) -> str:
    if isinstance(rank, Mapping):
        return f"tp{int(rank.get('tp', 0) or 0)}-dp{int(rank.get('dp', 0) or 0)}-pp{int(rank.get('pp', 0) or 0)}"
    return str(rank)


def steps_trace(ranks: Sequence[tuple[Any, Iterable[Mapping[str, Any]]]], last: int) -> dict[str, Any]:
    """``ranks``: (rank dict or label, that rank's step records as dicts) per track."""
    tracks = [(_rank_label(r), sorted(recs, key=lambda d: int(d.get("t_start_ns", 0)))) for r, recs in ranks]
    starts = [int(d.get("t_start_ns", 0)) for _, recs in tracks for d in recs]
    t0 = min(starts, default=0)
    events: list[dict[str, Any]] = [process_event()]
    for i, (label, recs) in enumerate(tracks):
        tid = i + 1
        events += track_meta(tid, label, i)
        for d in recs:
            events += _record_events(d, tid, t0)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": other_data(t0, last, sum(len(r) for _, r in tracks))}


def process_event() -> dict[str, Any]:
    return {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": PROCESS}}


def track_meta(tid: int, label: str, sort: int) -> list[dict[str, Any]]:
    """The naming events of rank ``label``'s track."""
    return _meta(tid, f"rank {label}", sort)


def rank_label(rank: Any) -> str:
    return _rank_label(rank)


def other_data(t0: int, last: int, steps: int, left_out: int = 0) -> dict[str, Any]:
    """``left_out``: older steps of the ``last`` the ranks left out, past ``MAX_TRACE_ROWS`` request rows."""
    return {"source": PROCESS, "t0_ns": t0, "last": last, "max_last": MAX_TRACE_STEPS,
            "bound": f"the last {last} step records per rank (each rank keeps at most {MAX_TRACE_STEPS}), "
                     f"newest first up to {MAX_TRACE_ROWS} request rows",
            "steps": steps, "steps_left_out": left_out, "layout": LAYOUT_NOTE}


def request_trace(req: Mapping[str, Any]) -> dict[str, Any]:
    """One request (``/ctx_profile/requests/{rid}``): its prefill and decode steps on a ``steps``
    track, the whole request on a ``request`` track.  A step row holds this request's context."""
    rows = sorted(req.get("step_rows") or (), key=lambda r: int(r.get("t_start_ns", 0)))
    first = int(req.get("t_first_ns") or (rows[0]["t_start_ns"] if rows else 0))
    t0 = first
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": PID, "args": {"name": PROCESS}}]
    events += _meta(1, "request", 0) + _meta(2, "steps", 1)
    end_req = int(req.get("t_end_ns") or first)
    rid = str(req.get("rid", ""))
    events.append(_x("request", "request", 1, first, max(first, end_req), t0, {
        "rid": rid, "prompt_tokens": req.get("prompt_tokens"), "steps": req.get("steps", 0),
        "accepted": req.get("accepted", 0), "committed": req.get("committed", 0),
        "decode_tok_s": req.get("decode_tok_s", 0.0), "finished": bool(req.get("finished"))}))
    pre = float(req.get("prefill_ms") or 0.0)
    if pre > 0:
        events.append(_x("prefill", "prefill", 2, first, step_end_ns(first, pre), t0,
                         {"rid": rid, "prompt_tokens": req.get("prompt_tokens"), "prefill_ms": pre}))
    for r in rows:
        start = int(r["t_start_ns"])
        end = step_end_ns(start, r["step_ms"])
        events.append(_x("decode step", "decode", 2, start, end, t0, {
            "step_id": r.get("step_id"), "ctx_len": r.get("ctx_len"), "batch_size": r.get("batch_size"),
            "draft_tokens": r.get("draft_tokens"), "accepted": r.get("accepted"),
            "committed": r.get("committed"), "step_ms": r.get("step_ms")}))
        events += phase_events(r.get("phases_ms") or {}, start, end, 2, t0)
    lost = rows_not_kept(req)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": PROCESS, "t0_ns": t0, "rid": rid, "steps": len(rows),
                          "step_rows_not_kept": lost, "layout": LAYOUT_NOTE}}
