"""One request's entry in the history (``requests.RequestLog``): its fields, its finish, its summary.

An entry is a plain dict (the ring holds thousands; a dict per request is what the C-level passes
of ``RequestLog`` move and read).  :func:`new_entry` is its one shape.  Its totals are what was
folded (steps whose row was not kept, or was dropped) plus its kept rows (``request_rows.Rows``),
summed in C when read (:func:`totals_of`).  :func:`summarize` is what every reader gets: the
entry without its internal fields, with its totals, its mean acceptance and decode rate, and its
step rows when asked for (``lazy``: built only when read).

A request is finished once (:func:`finish`): by the step record that says so (stamped with the
record's ``end_ns``) or by a ``RequestEnd`` (its ``t_ns``).  The stamp is how a reader that lags
behind the history (the exporters) finds the use of a reused rid that a given record finished.

Pure; imports only the package's record types.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from ..model.records import RequestEnd
from .request_rows import LazyRows, row_dict

# The entry's own bookkeeping, never shown to a reader.
INTERNAL = ("step_rows", "rows_at_fold", "rows_at_end", "accepted_drafts", "finished_at", "decoded_at_prefill")
# The totals a request's kept rows add to (``Rows.totals``).
TOTALS = ("steps", "accepted", "committed", "decode_ms", "max_step_ms", "ctx_first", "ctx_last", "t_end_ns")


def new_entry(rid: str, t_ns: int) -> dict[str, Any]:
    """A request first seen at ``t_ns``: no step yet."""
    return {
        "rid": rid,
        "use": 0,  # how many earlier requests used this rid (SGLang allows reuse once finished)
        "prompt_tokens": None, "prefill_ms": 0.0,
        "steps": 0, "accepted": 0, "committed": 0, "decode_ms": 0.0,
        "max_step_ms": 0.0,  # the slowest decode step, also when its row is no longer kept
        "ctx_first": None, "ctx_last": None, "finished": False,
        "retractions": 0,  # SGLang's retractions of the request (KV pressure), counted at its re-prefills
        "aborted": "",  # "retracted" / "queued": aborted while waiting in SGLang's queue (``end``)
        "steps_truncated": 0,
        "step_rows_dropped": 0,
        "t_first_ns": t_ns,
        "t_end_ns": t_ns,
        "trace_parent": "",
        "step_rows": [],
        "rows_at_fold": 0,  # len(step_rows) when ctx_last was last folded: a later row is newer
        "rows_at_end": 0,  # len(step_rows) when t_end_ns was last set: a later row ends later
        "partial": False,  # (re)created after its prefill, or ran while profiling stopped: its totals miss steps
        "finished_at": 0,  # the stamp of what finished it (``finish``): a record's end_ns, an end's t_ns
        "accepted_drafts": 0,  # records.accepted_drafts of the folded steps (the self-audit's)
        "decoded_at_prefill": 0,  # its decode steps (``decode_steps``) at its latest prefill row
        "completion_tokens": None,  # SGLang's own count, read at its finish (``finish``): None unread
    }


def finish(r: dict[str, Any], stamp: int, books: Optional[tuple[int, int, int]] = None) -> None:
    """Mark a request finished by the record or end stamped ``stamp``; a later record that repeats
    the finish keeps the first stamp.  ``books``: SGLang's own for it (``StepRecord.books``), whose
    ``completion_tokens`` the entry keeps where they were read."""
    if not r["finished"]:
        r["finished"], r["finished_at"] = True, stamp
        if books is not None and books[1] >= 0:
            r["completion_tokens"] = books[1]


def decode_steps(r: Mapping[str, Any]) -> int:
    """A request's decode steps so far: those folded and its kept rows (a row dropped for the budget
    is folded first), so the count only grows."""
    return r["steps"] + len(r["step_rows"])


def ended_unseen(r: dict[str, Any], com: int, decoded: int, prompt: Optional[int], ctx: int,
                  retracted: int) -> bool:
    """A first prefill (no output, no token) under the rid of a partial entry that had another known
    prompt (a retraction never changes it), or decoded since its latest prefill row, this row no
    retraction's (dropped output, ``input_embeds``): it ended unseen, and this is a new request."""
    if not (r["partial"] and not com and not decoded and prompt is not None and ctx == prompt):
        return False
    if r["prompt_tokens"] is not None and prompt != r["prompt_tokens"]:
        return True
    return not retracted and decode_steps(r) > r["decoded_at_prefill"]


def starts_prefill(r: Optional[dict[str, Any]], com: int, prompt: Optional[int], ctx: int, retracted: int) -> bool:
    """Whether a prefill row of the request (its entry ``r``; None: none held) starts its prefill: a
    new request or use, a re-prefill after a retraction, a prefill again after decoding, or one that
    ended unseen (:func:`ended_unseen`); else it continues a chunked prefill (the same prompt)."""
    return (r is None or r["finished"] or bool(retracted) or decode_steps(r) > r["decoded_at_prefill"]
            or ended_unseen(r, com, 0, prompt, ctx, retracted))


def end_unheld(entries: Iterable[tuple[Any, dict[str, Any]]], held: frozenset[str], stamp: int) -> int:
    """Profiling starts again: an unfinished request SGLang no longer holds (``held``: the rids it
    does; an entry's key is its rid) finished while it was off; it ends now, partial (no record says
    it finished, so no exporter exports it).  Returns how many ended."""
    ended = [r for key, r in entries if not r["finished"] and key not in held]
    for r in ended:
        finish(r, stamp)
        r["partial"] = True
    return len(ended)


def output_tokens(r: Mapping[str, Any]) -> int:
    """The tokens a request's client got: SGLang's ``completion_tokens`` where its finish carried them
    (``max_new_tokens=0`` keeps none), else its prefill's first token and the ones committed after
    (the same where the history is whole); none for a request aborted while it
    waited before any step, token or retraction of it (before its first step, or between the chunks
    of its first prefill).  A retraction that hit its first prefill in flight, then an abort, reads
    as one token where SGLang has none (nothing here tells the two apart)."""
    if r.get("completion_tokens") is not None:
        return int(r["completion_tokens"])
    aborted_early = r.get("aborted") and not (r.get("steps") or r.get("committed") or r.get("retractions"))
    return 0 if aborted_early else 1 + int(r.get("committed") or 0)


def rows_not_kept(r: Mapping[str, Any]) -> int:
    """A request's steps with no step row (and no step span): past its ``max_steps``, or dropped for
    the history's global row budget; its totals still count them."""
    return int(r.get("steps_truncated") or 0) + int(r.get("step_rows_dropped") or 0)


def tok_s(r: Mapping[str, Any]) -> float:
    """Decode tokens per second: committed tokens over decode time (0 before a decode step)."""
    decode_s = r["decode_ms"] / 1e3
    return r["committed"] / decode_s if decode_s > 0 else 0.0


def totals_of(r: Mapping[str, Any]) -> dict[str, Any]:
    """A request's totals: what was folded (steps without a kept row) plus its kept rows."""
    rows = r["step_rows"]
    if not rows:
        return {k: r[k] for k in TOTALS}
    return rows.totals(r)


def summarize(r: Mapping[str, Any], with_steps: bool, lazy: bool = False,
              totals: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """What a reader gets of an entry (``totals``: its totals, when already worked out)."""
    out = {k: v for k, v in r.items() if k not in INTERNAL}
    out.update(totals_of(r) if totals is None else totals)
    steps = out["steps"]
    out["accepted_per_step"] = out["accepted"] / steps if steps else 0.0
    out["decode_tok_s"] = tok_s(out)
    if with_steps:
        rows = r["step_rows"]
        out["step_rows"] = LazyRows(rows) if lazy else [row_dict(t) for t in rows]
    return out


def aborted_summary(end: RequestEnd) -> dict[str, Any]:
    """The summary of a request ``end`` ended that the history does not hold as aborted (it was
    aborted before its first step): no steps, finished and aborted at ``end.t_ns``."""
    r = new_entry(end.rid, end.t_ns)
    finish(r, end.t_ns)
    r["aborted"] = end.kind
    r["retractions"] = end.retractions
    return summarize(r, with_steps=True)
