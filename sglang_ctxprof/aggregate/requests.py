"""Bounded per-request history: totals for every recent request plus its step-by-step story.

The ring keeps the last ``capacity`` requests (least recently updated are evicted) and, per request,
at most ``max_steps`` step rows (later rows are counted but not kept); all requests together keep at
most ``max_rows`` rows after every record (the oldest requests' rows are dropped first).  A request's
rows are ints in one untracked array (``request_rows.Rows``: the key of the step's shared ``meta`` in
the log's table, then its own ctx_len, accepted, committed), so the garbage collector walks no row,
only the table: one entry per step some kept row refers to (a step that kept no row stores none;
those whose rows were all dropped or evicted are let go when the table has doubled, ``PRUNE`` steps
at the least).  A decode step is taken ``CHUNK`` requests per stage (``stages``), each stage in
C-level passes (new requests found, all moved to the ring's newest end, one row appended per
request); Python work only for requests that are new, get their first row, are past ``max_steps``
or finished.  A request's totals are its kept rows plus what was folded when rows were not kept or
were dropped, summed in C when the request is read (``request_entry.totals_of``).  This is what
``/ctx_profile/requests`` serves and what the exact-accounting tests reconcile against SGLang's
``meta_info``.  Only ids, lengths and timings are kept: never prompt or output text.

An entry (re)created after the request's prefill (evicted, or the history cleared), or running
while profiling stopped (``interrupt``), misses steps: served ``partial``, no ``tally`` for the
self-audit.  A rid seen again is a new use (``_reuse``) when its use had finished and a prefill comes,
or any step once profiling stopped and started (or a step was lost) after it finished, or a first
prefill (no retraction's) after such a partial use decoded since its latest prefill row, or a first
prefill of another prompt (it ended unseen).

A request aborted while it waited in SGLang's queue gets no step that says it finished: ``end``
marks it finished with ``aborted`` (``"retracted"``: it was waiting to be prefilled again after a
retraction; ``"queued"``: it had been prefilled, e.g. between chunks) and counts it in ``aborted``,
which also counts the requests aborted before their first step (never in the ring), by kind in
``aborted_by``; ``aborted_summary`` is what the exporters export for one of those.  Pure.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict, deque
from itertools import compress, count, filterfalse, islice, repeat
from operator import attrgetter, gt, itemgetter, not_
from typing import Any, Iterator, Optional, Union

from ..model.names import ABORT_KINDS, KIND_DECODE
from ..model.records import RequestEnd, StepRecord, accepted_drafts
from .request_entry import (decode_steps, end_unheld, ended_unseen, finish, new_entry, starts_prefill, summarize,
                            tok_s, totals_of)
from .request_rows import W, Meta, Metas, Rows, StepRow, append_all, meta_of, prune

__all__ = ["CHUNK", "MAX_ROWS", "RequestLog", "StepRow"]

Key = Union[str, tuple[str, int]]  # a ring key: the rid of its latest use, (rid, use) of an earlier one


CHUNK = 64  # requests of a decode step folded in one stage (``RequestLog.stages``)
# Step rows kept over all requests together (32 B each, plus their steps' shared facts).  Beyond it the
# rows of the requests that got rows longest ago are dropped (their totals stay; ``step_rows_dropped``).
MAX_ROWS = 65536
# Steps between two lettings-go of the metas no kept row refers to (``RequestLog._prune_metas``).
PRUNE = 1024


class RequestLog:
    def __init__(self, capacity: int = 4096, max_steps: int = 4096, max_rows: int = MAX_ROWS) -> None:
        self.capacity = max(1, capacity)
        self.max_steps = max(0, max_steps)
        self.max_rows = max(0, max_rows)
        self._key = 0  # the next decode step's key (increasing; steps that kept no row leave holes)
        self.clear()

    def __len__(self) -> int:
        return len(self._reqs)

    def observe(self, rec: StepRecord) -> None:
        for _ in self.stages(rec):
            pass

    def stages(self, rec: StepRecord) -> Iterator[None]:
        """``observe`` in stages: a decode step's requests ``CHUNK`` at a time, yielding between two,
        before shedding rows past the budget and before letting go of unreferenced metas (the drain
        thread hands the GIL over there).  Exhausting it is ``observe``; the caller must exhaust it
        before the next record."""
        if rec.kind != KIND_DECODE:
            self._observe_prefill(rec)
            return
        n, key = len(rec.rids), self._key
        self._key += 1
        meta = meta_of(rec)
        for lo in range(0, n, CHUNK):
            if lo:
                yield
            self._decode_rows(rec, lo, min(n, lo + CHUNK), key, meta)
        if rec.trace_parents:
            self._trace_parents(rec)
        if self.rows > self.max_rows:
            yield  # shedding the oldest rows is a piece of its own (at a full budget: every step)
            self._shed_rows()
        if len(self._metas) >= self._prune_at:
            yield
            yield from self._prune_metas()

    def _decode_rows(self, rec: StepRecord, lo: int, hi: int, key: int, meta: Meta) -> None:
        """Requests ``lo:hi`` of a decode step in C-level passes: the new ones added, all moved to the
        newest end of the ring, each given the step's row (``request_rows.append_all``); Python work
        only for requests that are new, get their first row, are past ``max_steps`` or finished.  The
        step's ``meta`` goes into the table under ``key`` before the first row that refers to it, and
        only then: a step whose requests are all past ``max_steps`` stores none."""
        reqs, rids = self._reqs, rec.rids[lo:hi]
        new = list(filterfalse(self._cells.__contains__, rids))  # new, or a new use (``interrupt``)
        if new and len(reqs) + len(new) > self.capacity:
            over = len(reqs) + len(new) - self.capacity
            if over > len(reqs) - len(rids) or any(map(set(rec.rids).__contains__, islice(reqs, over))):
                return self._decode_rows_one_by_one(rec, lo, hi, key, meta)  # it would evict one of this step's
        for rid in new:
            old = reqs.get(rid)
            self._add(rid, rec) if old is None else self._reuse(rid, old, rec)
        _drain(map(reqs.move_to_end, rids))
        rows = list(map(self._cells.__getitem__, rids))
        lens = list(map(len, rows))  # cells: W per kept row
        ctx, acc, com = rec.ctx_lens[lo:hi], rec.accepted[lo:hi], rec.committed[lo:hi]
        max_steps, cap = self.max_steps, W * self.max_steps
        if max_steps and not min(lens):  # a request's first kept row: it now holds rows
            self._with_rows.update(dict.fromkeys(compress(rids, map(not_, lens))))
        if max(lens) < cap:
            self._metas[key] = meta
            append_all(rows, key, ctx, acc, com)
            self.rows += len(rows)
        else:  # some are past max_steps: their steps are folded into the totals, no row kept
            keep = list(map(gt, repeat(cap), lens))
            kept = list(compress(rows, keep))
            if kept:
                self._metas[key] = meta
            append_all(kept, key, compress(ctx, keep), compress(acc, keep), compress(com, keep))
            self.rows += len(kept)
            t_dev, nd = rec.end_ns, rec.non_draft_tokens
            for i in compress(range(len(rids)), map(not_, keep)):
                r = reqs[rids[i]]
                r["steps_truncated"] += 1
                self._fold_step(r, ctx[i], acc[i], com[i], rec.step_ms, t_dev, bool(lens[i]), nd)
        for i in compress(range(lo, hi), rec.finished[lo:hi]):
            finish(reqs[rec.rids[i]], rec.end_ns, rec.books[i] if rec.books else None)

    def _decode_rows_one_by_one(self, rec: StepRecord, lo: int, hi: int, key: int, meta: Meta) -> None:
        """``_decode_rows`` request by request, where adding a new request evicts one of this step's
        own (a ring smaller than the step's batch): the ring's order is then exactly as if each
        request was recorded in turn."""
        reqs, with_rows, max_steps = self._reqs, self._with_rows, self.max_steps
        t_dev = rec.end_ns
        for i, rid, ctx, acc, com, fin in zip(count(lo), rec.rids[lo:hi], rec.ctx_lens[lo:hi], rec.accepted[lo:hi],
                                              rec.committed[lo:hi], rec.finished[lo:hi]):
            r = reqs.get(rid)
            if r is None:
                r = self._add(rid, rec)
            elif rid not in self._cells:  # a new use (``interrupt``)
                r = self._reuse(rid, r, rec)
            else:
                reqs.move_to_end(rid)
            rows = r["step_rows"]
            if len(rows) < max_steps:
                if not rows:
                    with_rows[rid] = None
                self._metas[key] = meta
                rows.append(key, ctx, acc, com)
                self.rows += 1
            else:
                r["steps_truncated"] += 1
                self._fold_step(r, ctx, acc, com, rec.step_ms, t_dev, bool(rows), rec.non_draft_tokens)
            if fin:
                finish(r, rec.end_ns, rec.books[i] if rec.books else None)

    def end(self, end: RequestEnd) -> int:
        """A request SGLang aborted while it waited: finished now, flagged ``aborted`` (one that finished
        is left as it is); returns its retractions no re-prefill counted (aborted before one)."""
        self.aborted += 1
        self.aborted_by[end.kind] += 1
        r = self._reqs.get(end.rid)
        if r is None or r["finished"]:
            return 0
        finish(r, end.t_ns)
        r["aborted"] = end.kind
        unseen = min(1, max(0, end.retractions - r["retractions"]))  # each earlier one had its re-prefill
        r["retractions"] = max(r["retractions"], end.retractions)  # SGLang's count (an entry rebuilt since)
        return unseen

    def _add(self, rid: str, rec: StepRecord) -> dict[str, Any]:
        r = self._reqs[rid] = new_entry(rid, rec.t_start_ns)
        r["partial"] = rec.kind == KIND_DECODE  # its prefill and any earlier step went unseen
        r["step_rows"] = rows = Rows(self._metas)
        self._cells[rid] = rows.cells
        if len(self._reqs) > self.capacity:
            old_rid, old = self._reqs.popitem(last=False)
            self._forget_rows(old_rid, old)
            self.evicted += 1
        return r

    @staticmethod
    def _fold_step(r: dict[str, Any], ctx: int, acc: int, com: int, step_ms: float, t_end: int,
                   has_rows: bool, non_draft_tokens: int) -> None:
        r["steps"] += 1
        r["accepted"] += acc
        r["accepted_drafts"] += accepted_drafts(acc, non_draft_tokens)
        r["committed"] += com
        r["decode_ms"] += step_ms
        r["max_step_ms"] = max(r["max_step_ms"], step_ms)
        if r["ctx_first"] is None and not has_rows:
            r["ctx_first"] = ctx
        r["ctx_last"] = ctx
        r["rows_at_fold"] = r["rows_at_end"] = len(r["step_rows"])  # the latest step: folded, not a row
        r["t_end_ns"] = t_end

    def _trace_parents(self, rec: StepRecord) -> None:
        for rid, tp in zip(rec.rids, rec.trace_parents):
            r = self._reqs.get(rid)
            if r is not None and tp and not r["trace_parent"]:
                r["trace_parent"] = tp

    def prefill_starts(self, rec: StepRecord) -> list[bool]:
        """Per prompt row of a prefill record (``StepRecord.bucket_lens``' rows): whether it starts its
        request's prefill (``request_entry.starts_prefill``); reads the history, changes nothing."""
        acc, com, ret, prompts, get = rec.accepted, rec.committed, rec.retractions, rec.prompt_lens, self._reqs.get
        rows = [i for i, a in enumerate(acc) if not a] if any(acc) else None
        return [starts_prefill(get(rec.rids[i]), com[i] if com else 0, prompts[i] if prompts else None,
                               rec.ctx_lens[i], ret[i] if ret else int(bool(com and com[i])))
                for i in (rows or range(len(rec.rids)))]

    def _observe_prefill(self, rec: StepRecord) -> None:
        prompts = rec.prompt_lens or (None,) * len(rec.rids)  # None: a record saved without them
        for i, rid in enumerate(rec.rids):
            r = self._reqs.get(rid)
            com = rec.committed[i] if rec.committed else 0
            decoded, prompt = rec.accepted[i], prompts[i]  # decoded: a running request's token riding a mixed batch
            retracted = rec.retractions[i] if rec.retractions else int(bool(com and not decoded))
            created = r is None or r["finished"] or ended_unseen(r, com, decoded, prompt, rec.ctx_lens[i], retracted)
            if r is None:
                r = self._add(rid, rec)
            elif created:  # a new request under a rid used before: keep the two apart
                r = self._reuse(rid, r, rec)
            else:
                self._reqs.move_to_end(rid)
            r["t_end_ns"] = rec.end_ns
            r["rows_at_end"] = len(r["step_rows"])
            if rec.finished[i]:
                finish(r, rec.end_ns, rec.books[i] if rec.books else None)
            if decoded:  # its token's time: the step it rode (its decode tok/s counts both)
                r["decode_ms"] += rec.step_ms
            else:  # a prefill row: what it decoded so far (``ended_unseen``)
                r["prefill_ms"] += rec.step_ms
                r["decoded_at_prefill"] = decode_steps(r)
            r["committed"] += com  # that token, or the re-prefill of a retracted request's (prompt + output)
            r["retractions"] += retracted  # SGLang's count (a record saved without it: re-prefills' tokens)
            if created and (com or (prompt is not None and rec.ctx_lens[i] > prompt)):
                r["partial"] = True  # it had output (a re-prefill's chunk, a mixed decode row): its start unseen
            elif retracted and rec.ctx_lens[i] == prompt and (r["steps"] or r["step_rows"]):
                r["partial"] = True  # prefilled again without the output it decoded: SGLang dropped it
                # (input_embeds), so the tokens held are not its completion_tokens any more
            if r["prompt_tokens"] is None and (prompt is not None or not com):
                r["prompt_tokens"] = rec.ctx_lens[i] if prompt is None else prompt
        if rec.trace_parents:
            self._trace_parents(rec)

    def _reuse(self, rid: str, old: dict[str, Any], rec: StepRecord) -> dict[str, Any]:
        """SGLang rejects only concurrent duplicate rids: a finished request's rid may come again.
        The earlier use stays in the ring under an internal key (its ``rid`` field unchanged, found
        by ``slowest``); the rid itself now names the new use (``use`` counts from 0)."""
        key = _use_key(rid, old["use"])
        self._reqs[key] = self._reqs.pop(rid)
        if self._with_rows.pop(rid, False) is None:
            self._with_rows[key] = None
        r = self._add(rid, rec)
        r["use"] = old["use"] + 1
        return r

    def _forget_rows(self, rid: str, r: dict[str, Any]) -> None:
        rows = r["step_rows"]
        self.rows -= len(rows)
        self._with_rows.pop(rid, None)
        if self._cells.get(r["rid"]) is rows.cells:
            del self._cells[r["rid"]]

    def _shed_rows(self) -> None:
        """Drop the step rows of the requests that got rows longest ago until within budget (their
        totals are folded first, so nothing but the rows is lost)."""
        while self.rows > self.max_rows and self._with_rows:
            rid, _ = self._with_rows.popitem(last=False)
            r = self._reqs.get(rid)
            if r is None:
                continue
            acc = r["accepted"]
            r.update(totals_of(r))
            r["accepted_drafts"] += r["step_rows"].accepted_drafts(r["step_rows"].cells, r["accepted"] - acc)
            r["rows_at_fold"] = r["rows_at_end"] = 0
            self.rows -= len(r["step_rows"])
            r["step_rows_dropped"] += len(r["step_rows"])
            r["step_rows"].clear()

    def _prune_metas(self) -> Iterator[None]:
        """Let go of metas no kept row refers to (``request_rows.prune``, in pieces), and run again when
        the table has doubled (``PRUNE`` steps at the least), so it stays within about twice what they
        refer to."""
        metas = self._metas
        yield from prune(metas, list(filter(None, map(_store, map(_rows_of, self._reqs.values())))))
        self._prune_at = len(metas) + max(PRUNE, len(metas))

    def get(self, rid: str, lazy: bool = False, with_steps: bool = True) -> dict[str, Any] | None:
        """One request's summary, with its step rows unless not ``with_steps`` (``lazy``: rows become
        dicts only when read)."""
        r = self._reqs.get(rid)
        return summarize(r, with_steps=with_steps, lazy=lazy) if r is not None else None

    def finished(self, rid: str, stamp: int, lazy: bool = False,
                 with_steps: bool = True) -> dict[str, Any] | None:
        """The summary of the use of ``rid`` that the record or end stamped ``stamp`` finished (its
        ``end_ns``; an end's ``t_ns``), or None when the history no longer holds it.  The rid may
        name a newer use by now: a reader that lags behind the history (the exporters) finds the
        older one under its internal key, newest first."""
        r = self._reqs.get(rid)
        while r is not None:
            if r["finished"] and r["finished_at"] == stamp:
                return summarize(r, with_steps=with_steps, lazy=lazy)
            if not r["use"]:
                return None
            r = self._reqs.get(_use_key(rid, r["use"] - 1))
        return None

    def tally(self, rid: str) -> Optional[tuple[int, int, int, int]]:
        """One request's (steps, accepted, committed, accepted drafts: ``records.accepted_drafts`` step
        by step): what was folded plus its kept rows, summed in C over the rows' cells (what the
        self-audit checks against SGLang's books; no row, no step time, no summary built), or None
        when the history does not hold it whole (evicted, or partial: (re)created after its prefill)."""
        r = self._reqs.get(rid)
        if r is None or r["partial"]:
            return None
        rows = r["step_rows"]
        if not rows:
            return r["steps"], r["accepted"], r["committed"], r["accepted_drafts"]
        return rows.tally(r)

    def interrupt(self) -> None:
        """Profiling stops (or a step went unrecorded): every request not finished yet misses steps, so
        it is partial (``tally`` hands it to no audit); a finished one's rid leaves ``_cells``, so a
        step of the rid after this is a new use (``_reuse``) whose prefill went unseen, not more steps
        of the finished one (a repeated finishing row, which overlap may send, stays with it)."""
        cells = self._cells
        for key, r in self._reqs.items():
            if not r["finished"]:
                r["partial"] = True
            elif cells.get(key) is r["step_rows"].cells:
                del cells[key]

    def slowest(self, n: int, with_steps: bool = True, max_rows: Optional[int] = None) -> list[dict[str, Any]]:
        """The ``n`` requests of lowest decode tok/s, slowest first, with their step rows
        (``with_steps``) up to ``max_rows`` in all, the slowest requests' first: one whose rows would
        pass it comes without them, ``step_rows_left_out`` saying how many."""
        # Rank on the raw totals and summarize only the n kept (a snapshot stays cheap at 4096 requests).
        # Each request's totals are worked out once: ranked on, then reused for the n kept.
        ranked = ((r, totals_of(r)) for r in self._reqs.values() if r["steps"] or r["step_rows"])
        top = heapq.nsmallest(max(0, n), ranked, key=lambda rt: tok_s(rt[1]))
        if not with_steps or max_rows is None:
            return [summarize(r, with_steps=with_steps, totals=t) for r, t in top]
        out, left = [], max_rows
        for r, t in top:
            k = len(r["step_rows"])
            out.append(summarize(r, with_steps=k <= left, totals=t))
            if k <= left:
                left -= k
            else:
                out[-1]["step_rows_left_out"] = k
        return out

    def totals(self) -> list[dict[str, Any]]:
        return [summarize(r, with_steps=False) for r in self._reqs.values()]

    def to_state(self, with_steps: bool = False) -> list[dict[str, Any]]:
        return [summarize(r, with_steps=with_steps) for r in self._reqs.values()]

    def ended_while_off(self, held: frozenset[str], stamp: int) -> int:
        """Profiling starts again: ``request_entry.end_unheld`` over the history."""
        return end_unheld(self._reqs.items(), held, stamp)

    def clear(self) -> None:
        """No request (the history as new; the step keys go on)."""
        self._reqs: "OrderedDict[Key, dict[str, Any]]" = OrderedDict()  # "step_rows": a Rows
        self._with_rows: "OrderedDict[Key, None]" = OrderedDict()  # keys holding rows, oldest first
        self._cells: dict[str, array] = {}  # rid -> the cells of its ring entry's rows (Rows.cells)
        self._metas: Metas = {}  # key -> a decode step's shared facts, for the rows that refer to it
        self._prune_at = PRUNE
        self.rows = 0
        self.evicted = 0
        self.aborted = 0  # requests aborted while waiting in SGLang's queue, seen by a step or not
        self.aborted_by = dict.fromkeys(ABORT_KINDS, 0)  # the same, by how they waited (RequestEnd.kind)


def _use_key(rid: str, use: int) -> Key:
    """The ring key of an earlier use of ``rid`` (``RequestLog._reuse``): a pair, which no client
    rid (a string) equals, whatever it spells."""
    return (rid, use)


_drain = deque(maxlen=0).extend  # runs an iterator to its end in C
_rows_of, _store = itemgetter("step_rows"), attrgetter("cells")
