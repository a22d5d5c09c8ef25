"""One request's kept step rows, stored as columns (``Rows``), and the row shape they are served in.

A request's rows are four columns: the decode steps' shared facts (one ``meta`` tuple per step, the
same object for every request of the step: step id, start, batch size, draft tokens, step time,
block size, denoise steps, host end, phases) in a list, and the request's own context length,
accepted and committed tokens in ``array('q')`` columns (not tracked by the garbage collector).  A
decode step appends to every kept request's columns with C-level ``map`` passes (``append_all``),
so the drain thread's Python work per step does not grow with the batch and the step allocates one
tracked object (its ``meta``) instead of one row tuple per request.  Rows become :class:`StepRow`
tuples (``row``) only when read; a request's totals are C-level sums over its columns (``sums``).

Pure; imports only the package's record types.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any, Iterable, Iterator, NamedTuple

from ..model.records import StepRecord, step_end_ns


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


# A step's shared facts, in this order (``meta``): StepRow without ctx_len, accepted and committed.
Meta = tuple
_M_T0, _M_MS = 1, 4
_ms_of = itemgetter(_M_MS)
_ACC, _COM, _MS = (itemgetter(StepRow._fields.index(k)) for k in ("accepted", "committed", "step_ms"))


def meta_of(rec: StepRecord) -> Meta:
    return (rec.step_id, rec.t_start_ns, rec.batch_size, rec.draft_tokens, rec.step_ms, rec.block_size,
            rec.denoise_steps, rec.host_end_ns, _phases(rec))


def row(m: Meta, ctx: int, acc: int, com: int) -> tuple:
    """A row as a plain tuple in :class:`StepRow`'s field order."""
    return (m[0], m[1], ctx, m[2], m[3], acc, com, m[4], m[5], m[6], m[7], m[8])


class Rows(Sequence):
    """A request's kept step rows, oldest first: columns, read as row tuples."""

    __slots__ = ("meta", "ctx", "acc", "com")

    def __init__(self) -> None:
        self.meta: list[Meta] = []
        self.ctx, self.acc, self.com = array("q"), array("q"), array("q")

    def __len__(self) -> int:
        return len(self.meta)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [row(*v) for v in zip(self.meta[i], self.ctx[i], self.acc[i], self.com[i])]
        return row(self.meta[i], self.ctx[i], self.acc[i], self.com[i])

    def __iter__(self) -> Iterator[tuple]:
        return map(row, self.meta, self.ctx, self.acc, self.com)

    def append(self, m: Meta, ctx: int, acc: int, com: int) -> None:
        self.meta.append(m)
        self.ctx.append(ctx)
        self.acc.append(acc)
        self.com.append(com)

    def clear(self) -> None:
        self.meta = []
        self.ctx, self.acc, self.com = array("q"), array("q"), array("q")

    def totals(self, r: Any) -> dict[str, Any]:
        """``r``'s folded totals plus these rows (sequential float sum of step times, as step by step)."""
        meta = self.meta
        ms = list(map(_ms_of, meta))
        last = meta[-1]
        return {
            "steps": r["steps"] + len(meta),
            "accepted": sum(self.acc, r["accepted"]),
            "committed": sum(self.com, r["committed"]),
            "decode_ms": sum(ms, r["decode_ms"]),
            "max_step_ms": max(r["max_step_ms"], max(ms)),
            "ctx_first": r["ctx_first"] if r["ctx_first"] is not None else self.ctx[0],
            "ctx_last": r["ctx_last"] if len(meta) == r["rows_at_fold"] else self.ctx[-1],
            "t_end_ns": r["t_end_ns"] if len(meta) == r["rows_at_end"] else step_end_ns(last[_M_T0], last[_M_MS]),
        }


_META, _CTX_C, _ACC_C, _COM_C = (attrgetter(k) for k in ("meta", "ctx", "acc", "com"))
_drain = deque(maxlen=0).extend  # runs an iterator to its end in C


def append_all(rows: list[Rows], m: Meta, ctx: Iterable[int], acc: Iterable[int], com: Iterable[int]) -> None:
    """One step's row for each of ``rows`` (aligned with the value columns): C-level passes only."""
    _drain(map(list.append, map(_META, rows), [m] * len(rows)))
    _drain(map(array.append, map(_CTX_C, rows), ctx))
    _drain(map(array.append, map(_ACC_C, rows), acc))
    _drain(map(array.append, map(_COM_C, rows), com))


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
    on a finished request from its totals and read its rows only when they export it)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[tuple]) -> None:
        self._rows = tuple(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [row_dict(t) for t in self._rows[i]]
        return row_dict(self._rows[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(row_dict, self._rows)
