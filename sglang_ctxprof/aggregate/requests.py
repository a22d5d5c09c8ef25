"""Bounded per-request history: totals for every recent request plus its step-by-step story.

The ring keeps the last ``capacity`` requests (least recently updated are evicted) and, per request,
at most ``max_steps`` step rows (later rows are counted but not kept); all requests together keep at
most ``max_rows`` rows, stored as compact tuples (the oldest requests' rows are dropped first).  This is what
``/ctx_profile/requests`` serves and what the exact-accounting tests reconcile against SGLang's
``meta_info``.  Only ids, lengths and timings are kept: never prompt or output text.

Pure; imports only the package's record types.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Mapping

from ..model.names import KIND_DECODE
from ..model.records import StepRecord


# Step rows kept over all requests together (~180 B each at realistic batch sizes).  Beyond it the
# rows of the requests that got rows longest ago are dropped (their totals stay; ``step_rows_dropped``).
MAX_ROWS = 65536


class RequestLog:
    def __init__(self, capacity: int = 4096, max_steps: int = 4096, max_rows: int = MAX_ROWS) -> None:
        self.capacity = max(1, capacity)
        self.max_steps = max(0, max_steps)
        self.max_rows = max(0, max_rows)
        self._reqs: "OrderedDict[str, dict[str, Any]]" = OrderedDict()
        self._with_rows: "OrderedDict[str, None]" = OrderedDict()  # rids holding rows, oldest first
        self.rows = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._reqs)

    def observe(self, rec: StepRecord) -> None:
        ph = None
        for i, rid in enumerate(rec.rids):
            r = self._reqs.get(rid)
            if r is None:
                r = self._new(rid, rec, i)
                self._reqs[rid] = r
                if len(self._reqs) > self.capacity:
                    old_rid, old = self._reqs.popitem(last=False)
                    self._forget_rows(old_rid, old)
                    self.evicted += 1
            else:
                self._reqs.move_to_end(rid)
            if rec.trace_parents and rec.trace_parents[i] and not r["trace_parent"]:
                r["trace_parent"] = rec.trace_parents[i]
            r["t_end_ns"] = rec.t_start_ns + int(rec.step_ms * 1e6)
            if rec.kind != KIND_DECODE:
                r["finished"] = r["finished"] or rec.finished[i]
                r["prefill_ms"] += rec.step_ms
                r["prompt_tokens"] = rec.ctx_lens[i]
                continue
            r["steps"] += 1
            r["accepted"] += rec.accepted[i]
            r["committed"] += rec.committed[i]
            r["decode_ms"] += rec.step_ms
            r["ctx_last"] = rec.ctx_lens[i]
            if r["ctx_first"] is None:
                r["ctx_first"] = rec.ctx_lens[i]
            r["finished"] = r["finished"] or rec.finished[i]
            if len(r["step_rows"]) < self.max_steps:
                if ph is None:  # one shared phase tuple per record, not one dict per row
                    ph = _phases(rec)
                r["step_rows"].append(_row(rec, i, ph))
                self.rows += 1
                if rid not in self._with_rows:
                    self._with_rows[rid] = None
                if self.rows > self.max_rows:
                    self._shed_rows()
            else:
                r["steps_truncated"] += 1

    def _forget_rows(self, rid: str, r: dict[str, Any]) -> None:
        self.rows -= len(r["step_rows"])
        self._with_rows.pop(rid, None)

    def _shed_rows(self) -> None:
        """Drop the step rows of the requests that got rows longest ago until within budget."""
        while self.rows > self.max_rows and self._with_rows:
            rid, _ = self._with_rows.popitem(last=False)
            r = self._reqs.get(rid)
            if r is None:
                continue
            self.rows -= len(r["step_rows"])
            r["step_rows_dropped"] += len(r["step_rows"])
            r["step_rows"] = []

    @staticmethod
    def _new(rid: str, rec: StepRecord, i: int) -> dict[str, Any]:
        return {
            "rid": rid,
            "prompt_tokens": None,
            "prefill_ms": 0.0,
            "steps": 0,
            "accepted": 0,
            "committed": 0,
            "decode_ms": 0.0,
            "ctx_first": None,
            "ctx_last": None,
            "finished": False,
            "steps_truncated": 0,
            "step_rows_dropped": 0,
            "t_first_ns": rec.t_start_ns,
            "t_end_ns": rec.t_start_ns,
            "trace_parent": "",
            "step_rows": [],
        }

    def get(self, rid: str) -> dict[str, Any] | None:
        r = self._reqs.get(rid)
        return summarize(r, with_steps=True) if r is not None else None

    def pop(self, rid: str) -> dict[str, Any] | None:
        """Remove one request and return its summary with steps (tail-based trace sinks)."""
        r = self._reqs.pop(rid, None)
        if r is not None:
            out = summarize(r, with_steps=True)
            self._forget_rows(rid, r)
            return out
        return None

    def slowest(self, n: int, with_steps: bool = True) -> list[dict[str, Any]]:
        # Rank on the raw totals and summarize only the n kept (a snapshot stays cheap at 4096 requests).
        top = heapq.nsmallest(max(0, n), (r for r in self._reqs.values() if r["steps"]), key=_tok_s)
        return [summarize(r, with_steps=with_steps) for r in top]

    def totals(self) -> list[dict[str, Any]]:
        return [summarize(r, with_steps=False) for r in self._reqs.values()]

    def to_state(self, with_steps: bool = False) -> list[dict[str, Any]]:
        return [summarize(r, with_steps=with_steps) for r in self._reqs.values()]

    def clear(self) -> None:
        self._reqs.clear()
        self._with_rows.clear()
        self.rows = 0
        self.evicted = 0


_ROW_KEYS = ("step_id", "t_start_ns", "ctx_len", "batch_size", "draft_tokens", "accepted", "committed",
             "step_ms", "t_end_ns")
_PHASE_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {}  # interned phase-name tuples


def _phases(rec: StepRecord) -> tuple[tuple[str, ...], tuple[float, ...]]:
    keys = tuple(rec.phases_ms)
    keys = _PHASE_KEYS.setdefault(keys, keys) if len(_PHASE_KEYS) < 64 else keys
    return keys, tuple(rec.phases_ms.values())


def _row(rec: StepRecord, i: int, ph: tuple) -> tuple:
    """A compact step row (a tuple sharing the record's phase tuple); dicts only when served."""
    return (rec.step_id, rec.t_start_ns, rec.ctx_lens[i], rec.batch_size, rec.draft_tokens,
            rec.accepted[i], rec.committed[i], rec.step_ms,
            rec.t_end_ns or rec.t_start_ns + int(rec.step_ms * 1e6), ph)


def row_dict(row: tuple) -> dict[str, Any]:
    d = dict(zip(_ROW_KEYS, row))
    keys, vals = row[-1]
    d["phases_ms"] = dict(zip(keys, vals))
    return d


def _tok_s(r: Mapping[str, Any]) -> float:
    decode_s = r["decode_ms"] / 1e3
    return r["committed"] / decode_s if decode_s > 0 else 0.0


def summarize(r: Mapping[str, Any], with_steps: bool) -> dict[str, Any]:
    steps = r["steps"]
    out = {k: v for k, v in r.items() if k != "step_rows"}
    out["accepted_per_step"] = r["accepted"] / steps if steps else 0.0
    out["decode_tok_s"] = _tok_s(r)
    if with_steps:
        out["step_rows"] = [row_dict(t) for t in r["step_rows"]]
    return out
