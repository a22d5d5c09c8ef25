"""One request's kept step rows, stored as ints in an untracked array (``Rows``), and the row shape
they are served in.

A decode step's shared facts (step id, start, batch size, draft tokens, step time, block size,
denoise steps, host end, phases, non-draft tokens) are one ``meta`` tuple, kept once per step that
kept a row, in the log's ``Metas`` table under an int key.  A request's rows are ``W`` ints per row
in one ``array('q')``: the step's key, then the request's own context length, accepted and
committed tokens.  An array holds no object references, so kept rows add nothing to what the
garbage collector walks, young or full collections alike: only the table (one entry per step still
referenced; ``prune`` lets go of the others) is walked.  A decode step appends every kept
request's row in one C-level ``map`` pass (``append_all``), so the drain thread's Python work per
step does not grow with the batch.  Rows become :class:`StepRow` tuples (``row``) only when read; a
request's totals are C-level sums over strided slices of its cells (``Rows.totals``).

Pure; imports only the package's record types.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from bisect import bisect_right
from itertools import accumulate, filterfalse, repeat, takewhile
from operator import itemgetter
from struct import Struct
from typing import Any, Iterable, Iterator, NamedTuple, Optional

from ..model.records import StepRecord, accepted_drafts_sum, step_end_ns


class StepRow(NamedTuple):
    """One decode step of one request, as the ring serves it (``row_dict``)."""

    step_id: int
    t_start_ns: int
    ctx_len: int  # this request's own context entering the step
    batch_size: int
    draft_tokens: int
    accepted: int
    committed: int
    step_ms: float
    block_size: int
    denoise_steps: int
    t_end_ns: int  # host clock when run_batch returned (records.host_end_ns)
    phases: tuple[tuple[str, ...], tuple[float, ...]]  # (names, ms): interned names, one tuple of values

    @property
    def end_ns(self) -> int:
        """The step's end by its measured time (records.step_end_ns)."""
        return step_end_ns(self.t_start_ns, self.step_ms)


# A step's shared facts, in this order (``meta``): StepRow without ctx_len, accepted and committed,
# then the step's non-draft tokens (what its accepted drafts are counted against; not served).
Meta = tuple
Metas = dict  # int key -> Meta: the steps a log's rows refer to (one table per log, shared by its Rows)
_M_T0, _M_MS, _M_ND = 1, 4, 9
_ms_of = itemgetter(_M_MS)


def meta_of(rec: StepRecord) -> Meta:
    return (rec.step_id, rec.t_start_ns, rec.batch_size, rec.draft_tokens, rec.step_ms, rec.block_size,
            rec.denoise_steps, rec.host_end_ns, _phases(rec), rec.non_draft_tokens)


def row(m: Meta, ctx: int, acc: int, com: int) -> tuple:
    """A row as a plain tuple in :class:`StepRow`'s field order."""
    return (m[0], m[1], ctx, m[2], m[3], acc, com, m[4], m[5], m[6], m[7], m[8])


W = 4  # cells per row: the key of the step's meta, then this request's ctx_len, accepted, committed


def cells() -> array:
    """An empty row store: signed 64-bit ints, no object references (the collector never walks it)."""
    return array("q")


class Rows(Sequence):
    """A request's kept step rows, oldest first, read as row tuples.  Stored flat in one int array
    (``cells``: ``W`` per row, the first the key of the step's meta in ``metas``), so a step appends
    a request's row with one C-level ``array.frombytes`` and keeps no object per row."""

    __slots__ = ("cells", "metas")

    def __init__(self, metas: "Metas", store: Optional[array] = None) -> None:
        self.metas = metas
        self.cells: array = cells() if store is None else store

    def __len__(self) -> int:
        return len(self.cells) // W

    def __getitem__(self, i: Any) -> Any:
        c = self.cells
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step == 1:
                return list(self._rows(c[W * lo:W * max(lo, hi)]))
            return [self[k] for k in range(lo, hi, step)]
        n = len(c) // W
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        return row(self.metas[c[W * i]], *c[W * i + 1:W * i + W])

    def _rows(self, c: array) -> Iterator[tuple]:
        return map(row, map(self.metas.__getitem__, c[0::W]), c[1::W], c[2::W], c[3::W])

    def __iter__(self) -> Iterator[tuple]:
        return self._rows(self.cells)

    def append(self, key: int, ctx: int, acc: int, com: int) -> None:
        self.cells.frombytes(_pack_row(key, ctx, acc, com))

    def clear(self) -> None:
        del self.cells[:]  # in place: the log's rid -> cells map keeps pointing at it

    def copy(self) -> "Rows":
        """A copy that keeps the metas its rows refer to (the log's table may let them go later)."""
        keys, metas = self.cells[0::W], self.metas
        return Rows(dict(zip(keys, map(metas.__getitem__, keys))), self.cells[:])

    def tally(self, r: Any) -> tuple[int, int, int, int]:
        """``r``'s folded (steps, accepted, committed, accepted drafts) plus these rows': C-level sums
        over one copy of the cells (taken at once, so a concurrent append or clear cannot split it)."""
        c = self.cells[:]
        acc = sum(c[2::W])
        return (r["steps"] + len(c) // W, r["accepted"] + acc, sum(c[3::W], r["committed"]),
                r["accepted_drafts"] + self.accepted_drafts(c, acc))

    def accepted_drafts(self, c: array, accepted: int) -> int:
        """The accepted drafts (``records.accepted_drafts`` of each row) of the rows in ``c`` (these
        rows' cells, or a copy of them; ``accepted``: their accepted tokens), summed in C against the
        non-draft tokens of the latest row's step: a request's steps share them (SGLang fixes its
        per-request count by the algorithm)."""
        return accepted_drafts_sum(c[2::W], self.metas[c[-W]][_M_ND], accepted) if c else 0

    def totals(self, r: Any) -> dict[str, Any]:
        """``r``'s folded totals plus these rows (sequential float sum of step times, as step by step)."""
        c, metas = self.cells, self.metas
        ms = list(map(_ms_of, map(metas.__getitem__, c[0::W])))
        last = metas[c[-W]]
        return {
            "steps": r["steps"] + len(ms),
            "accepted": sum(c[2::W], r["accepted"]),
            "committed": sum(c[3::W], r["committed"]),
            "decode_ms": sum(ms, r["decode_ms"]),
            "max_step_ms": max(r["max_step_ms"], max(ms)),
            "ctx_first": r["ctx_first"] if r["ctx_first"] is not None else c[1],
            "ctx_last": r["ctx_last"] if len(ms) == r["rows_at_fold"] else c[-W + 1],
            "t_end_ns": r["t_end_ns"] if len(ms) == r["rows_at_end"] else step_end_ns(last[_M_T0], last[_M_MS]),
        }


_drain = deque(maxlen=0).extend  # runs an iterator to its end in C


_pack_row = Struct(f"{W}q").pack  # one row's cells as the array's machine bytes


def append_all(stores: list[array], key: int, ctx: Iterable[int], acc: Iterable[int], com: Iterable[int]) -> None:
    """One step's row (its meta's ``key``) for each request's cells (aligned with the value columns):
    one C-level pass, each row packed to bytes and copied in (``array.extend`` of a tuple converts
    item by item, twice as slow)."""
    _drain(map(array.frombytes, stores, map(_pack_row, repeat(key), ctx, acc, com)))


def prune(metas: Metas, stores: list[array]) -> Iterator[None]:
    """Let go of the metas no row of ``stores`` (every kept row store of a log) refers to, in C-level
    passes: those older than the oldest row (each store's first: cheap), and where that does not
    halve the table (a long-lived request's old rows hold back newer steps no row refers to), every
    one whose key no row holds.  That full pass is pieces, a yield before each: the stores' sizes,
    the keys of the stores that hold :data:`PRUNE_PIECE` rows together (or of one larger store),
    then :data:`PRUNE_PIECE` metas looked at (the drain thread hands the GIL over between two); the
    caller exhausts it before the log changes."""
    size = len(metas)
    oldest = min(map(_first, stores), default=None)
    if oldest is None:
        metas.clear()
        return
    _drain(map(metas.__delitem__, list(takewhile(oldest.__gt__, metas))))  # keys are in step order
    if 2 * len(metas) <= size:
        return
    yield
    live: set[int] = set()
    ends = list(accumulate(map(len, stores)))  # cells up to each store
    lo = 0
    while lo < len(stores):  # per piece: the stores that hold PRUNE_PIECE rows together, or one store
        hi = max(lo + 1, bisect_right(ends, (ends[lo - 1] if lo else 0) + W * PRUNE_PIECE, lo))
        yield
        _drain(map(live.update, map(_keys_of, stores[lo:hi])))
        lo = hi
    keys = list(metas)
    for k in range(0, len(keys), PRUNE_PIECE):
        yield
        _drain(map(metas.__delitem__, filterfalse(live.__contains__, keys[k:k + PRUNE_PIECE])))


PRUNE_PIECE = 2048  # rows (or metas) a piece of the full prune pass looks at (~50 µs)
_first, _keys_of = itemgetter(0), itemgetter(slice(0, None, W))  # a row store's first key, all its keys
_PHASE_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {}  # interned phase-name tuples


def _phases(rec: StepRecord) -> tuple[tuple[str, ...], tuple[float, ...]]:
    keys = tuple(rec.phases_ms)
    keys = _PHASE_KEYS.setdefault(keys, keys) if len(_PHASE_KEYS) < 64 else keys
    return keys, tuple(rec.phases_ms.values())


def row_dict(t: tuple) -> dict[str, Any]:
    d = dict(zip(StepRow._fields, t))
    keys, vals = d.pop("phases")
    d["phases_ms"] = dict(zip(keys, vals))
    return d


class LazyRows(Sequence):
    """A request's step rows as a read-only sequence of dicts built on access (the exporters decide
    on a finished request from its totals and read its rows only when they export it): a copy of
    its cells, taken in C."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Rows) -> None:
        self._rows = rows.copy()

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [row_dict(t) for t in self._rows[i]]
        return row_dict(self._rows[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(row_dict, self._rows)
