"""The aggregator's one history of recent steps: a bounded ring of typed rows, newest last.

Each :class:`RecentStep` holds what the waterfall charges a request's wall time with (``waterfall``:
step id, kind, host start and end, measured ms) for the last ``depth`` steps, and the whole
:class:`~sglang_ctxprof.model.records.StepRecord` for the last ``with_records`` of them (the trace
export's ``?last=N`` and the capture's step slices); an older row lets go of its record, so memory
stays bounded by ``depth`` compact rows plus ``with_records`` records.  :meth:`RecentSteps.json_rows`
serves the trace export from the scheduler thread cheaply: each record's JSON is written once and
reused by later reads while the record is among those last read.  Pure.
"""

from __future__ import annotations

import json
from collections import deque
from itertools import islice
from typing import Iterator, NamedTuple, Optional

from ..model.names import MAX_TRACE_ROWS, MAX_TRACE_STEPS
from ..model.records import StepRecord

# Recent steps kept for the per-request waterfall.
TIMELINE_STEPS = 65536


class RecentStep(NamedTuple):
    step_id: int
    kind: str
    t_start_ns: int
    t_end_ns: int  # host clock when the scheduler got the step back (records.host_end_ns)
    step_ms: float
    record: Optional[StepRecord]  # None once the row is older than the ring's last ``with_records``


class RecentSteps:
    __slots__ = ("_ring", "with_records", "_json")

    def __init__(self, depth: int = TIMELINE_STEPS, with_records: int = MAX_TRACE_STEPS) -> None:
        self._ring: "deque[RecentStep]" = deque(maxlen=max(1, depth))
        self.with_records = max(0, min(with_records, depth))
        self._json: dict[int, tuple[StepRecord, str]] = {}  # id(record) -> (record, its JSON)

    def __len__(self) -> int:
        return len(self._ring)

    def __iter__(self) -> Iterator[RecentStep]:
        return iter(self._ring)

    def add(self, rec: StepRecord) -> None:
        ring = self._ring
        ring.append(RecentStep(rec.step_id, rec.kind, rec.t_start_ns, rec.host_end_ns, rec.step_ms, rec))
        k = self.with_records + 1
        if len(ring) >= k:
            old = ring[-k]
            if old.record is not None:
                ring[-k] = old._replace(record=None)

    def records(self, n: Optional[int] = None) -> list[StepRecord]:
        """The last ``n`` (at most ``with_records``) records, oldest first."""
        n = self.with_records if n is None else max(0, min(int(n), self.with_records))
        newest = [row.record for row in islice(reversed(self._ring), n) if row.record is not None]
        return newest[::-1]

    def json_rows(self, n: Optional[int] = None, max_rows: int = MAX_TRACE_ROWS) -> tuple[list[str], int]:
        """``records(n)`` as ``StepRecord.to_dict()`` rows in JSON text, oldest first, and how many of
        them were left out: the newest steps whose batches hold ``max_rows`` request rows in all (at
        least one step).  A record's row is written once and kept while it is among the rows last
        served, so a read loop costs the scheduler only the steps since its previous read; a list of
        strings is cheap to pickle, and the reader can tell the rows it already laid out by their text
        (``views.trace_json``)."""
        recs = self.records(n)
        start, rows = len(recs), 0
        while start > 0:
            rows += len(recs[start - 1].rids) or 1
            if rows > max_rows and start < len(recs):
                break
            start -= 1
        memo, fresh = self._json, {}
        for rec in recs[start:]:
            hit = memo.get(id(rec))
            if hit is None or hit[0] is not rec:
                hit = (rec, json.dumps(rec.to_dict(), separators=(",", ":")))
            fresh[id(rec)] = hit
        self._json = fresh
        return [row for _, row in fresh.values()], start
