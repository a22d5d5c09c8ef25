"""``GET /ctx_profile/trace.json?last=N`` written as JSON text directly, each step's events once.

:func:`~sglang_ctxprof.views.trace_events.steps_trace` builds ~8 event dicts per step and the reply
serializes them: for 2048 steps, parsing the rows, laying out the events and writing them took
~130 ms of Python in SGLang's HTTP process on every read.  Yet a step row never changes, and in a
read loop all but the newest steps were already written by the previous read.  The only part of an
event that depends on the other steps is ``ts`` (microseconds from the earliest step shown, ``t0``).

:class:`TraceWriter` keeps, per (track, step row text), that step's events as JSON text split around
``ts`` with the event's start in ns; :meth:`TraceWriter.render` then writes ``ts`` for the current
``t0`` and joins.  The text equals ``http_guard.json_response(steps_trace(...))``'s body byte for
byte (the same key order, separators, float repr and non-finite-as-null).  The memo keeps only
the rows of the last render, so it is bounded by what one read ships; its entries are tuples of
ints and strings, which the garbage collector stops tracking, so the 2048 steps it holds add nothing
to the full collections of SGLang's HTTP process.  One writer per thread: the
build thread (``http_build``) is its only user.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from .http_guard import finite
from .trace_events import PID, other_data, process_event, rank_label, record_slices, track_meta

# A step's events, flat: (step start ns, then per event: its start ns, the text before the ts
# value, the text after it).  One tuple of ints and strings: the garbage collector stops tracking
# it the first time it looks (a nested tuple may need several looks).
Entry = tuple[int | str, ...]


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(finite(obj), allow_nan=False, separators=(",", ":"))


_HEADS: dict[tuple[str, str, int], str] = {}


def _head(name: str, cat: str, tid: int) -> str:
    """``{"name":...,"tid":N,"ts":`` of a complete event (few distinct: remembered)."""
    key = (name, cat, tid)
    h = _HEADS.get(key)
    if h is None:
        h = _HEADS[key] = _dumps({"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid})[:-1] + ',"ts":'
        if len(_HEADS) > 4096:
            _HEADS.clear()
    return h


def _entry(row: str, tid: int) -> Entry:
    d = json.loads(row)
    start = int(d.get("t_start_ns", 0))
    flat: list[int | str] = [start]
    for name, cat, s, e, args in record_slices(d):
        tail = ',"dur":' + repr((e - s) / 1e3)  # ints over 1e3: finite, and json writes floats by repr
        if args:
            tail += ',"args":' + _dumps(args)
        flat += (s, _head(name, cat, tid), tail + "}")
    return tuple(flat)


class TraceWriter:
    def __init__(self) -> None:
        self._memo: dict[tuple[int, str], Entry] = {}
        self.written = 0  # step rows laid out (not found in the memo), for tests and benches

    def render(self, ranks: Sequence[tuple[Any, Sequence[str]]], last: int, left_out: int = 0) -> str:
        """``ranks``: (rank dict or label, that rank's step rows as JSON texts) per track; ``left_out``:
        the older steps the ranks left out (``names.MAX_TRACE_ROWS``)."""
        memo, fresh = self._memo, {}
        tracks: list[tuple[str, list[Entry]]] = []
        for i, (rank, rows) in enumerate(ranks):
            tid = i + 1
            entries = []
            for row in rows:
                key = (tid, row)
                hit: Optional[Entry] = memo.get(key)
                if hit is None:
                    hit = _entry(row, tid)
                    self.written += 1
                fresh[key] = hit
                entries.append(hit)
            entries.sort(key=lambda en: en[0])  # stable, as steps_trace's sort
            tracks.append((rank_label(rank), entries))
        self._memo = fresh
        t0 = min((en[0] for _, ents in tracks for en in ents), default=0)
        parts = [_dumps(process_event())]
        for i, (label, entries) in enumerate(tracks):
            parts += [_dumps(m) for m in track_meta(i + 1, label, i)]
            for en in entries:
                parts += [en[k + 1] + repr((en[k] - t0) / 1e3) + en[k + 2] for k in range(1, len(en), 3)]
        steps = sum(len(ents) for _, ents in tracks)
        return ('{"traceEvents":[' + ",".join(parts) + '],"displayTimeUnit":"ms","otherData":'
                + _dumps(other_data(t0, last, steps, left_out)) + "}")
