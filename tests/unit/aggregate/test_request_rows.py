"""aggregate/request_rows: a request's rows stored flat read back as the row tuples they were, and
fold into the same totals as row by row."""

from __future__ import annotations

import pytest

from sglang_ctxprof.aggregate.request_rows import LazyRows, Rows, StepRow, row
from sglang_ctxprof.model.records import step_end_ns

PH = (("draft", "verify"), (1.0, 2.0))


def _meta(i: int) -> tuple:
    return (i, 10**18 + i * 10**7, 4, 3, 2.5 + i, 0, 0, 10**18 + i * 10**7 + 5, PH, 1)


def _rows(n: int) -> Rows:
    metas = {}
    rows = Rows(metas)
    for i in range(n):
        metas[i] = _meta(i)
        rows.append(i, 100 + i, 1 + i % 3, i % 2)
    return rows


def test_rows_read_back_as_row_tuples_by_index_slice_and_iteration():
    rows = _rows(4)
    want = [row(_meta(i), 100 + i, 1 + i % 3, i % 2) for i in range(4)]
    assert len(rows) == 4 and list(rows) == want and rows[-1] == want[-1] and rows[1:3] == want[1:3]
    assert StepRow(*rows[2]).ctx_len == 102 and StepRow(*rows[2]).step_ms == 4.5
    with pytest.raises(IndexError):
        rows[4]
    assert rows[::2] == want[::2] and rows[3:1] == [] and rows[-2:] == want[-2:]
    lazy = LazyRows(rows)
    rows.clear()  # the lazy copy keeps what was read, the metas its rows refer to included
    rows.metas.clear()
    assert len(rows) == 0 and not rows and len(lazy) == 4 and lazy[0]["phases_ms"] == {"draft": 1.0, "verify": 2.0}
    assert [d["ctx_len"] for d in lazy] == [100, 101, 102, 103]


def test_totals_are_the_folded_ones_plus_each_row_in_order():
    rows = _rows(5)
    folded = {"steps": 2, "accepted": 3, "committed": 1, "decode_ms": 0.1, "max_step_ms": 9.0, "ctx_first": 50,
              "ctx_last": 60, "t_end_ns": 7, "rows_at_fold": 0, "rows_at_end": 0}
    ms = 0.1
    for i in range(5):
        ms += 2.5 + i  # step by step, oldest first: the very same float
    assert rows.totals(folded) == {
        "steps": 7, "accepted": 3 + sum(1 + i % 3 for i in range(5)), "committed": 1 + 2, "decode_ms": ms,
        "max_step_ms": 9.0, "ctx_first": 50, "ctx_last": 104, "t_end_ns": step_end_ns(10**18 + 4 * 10**7, 6.5)}
    latest_folded = dict(folded, rows_at_fold=5, rows_at_end=5, ctx_first=None)
    t = rows.totals(latest_folded)
    assert (t["ctx_first"], t["ctx_last"], t["t_end_ns"]) == (100, 60, 7)


def test_prune_lets_go_of_every_meta_no_row_refers_to():
    """Older than the oldest row: let go at once; where that does not halve the table, the keys in
    between that no row holds as well.  No row at all: an empty table."""
    from array import array

    from sglang_ctxprof.aggregate.request_rows import prune

    def store(*keys: int) -> array:
        return array("q", [c for k in keys for c in (k, 1, 1, 1)])

    metas = {k: _meta(k) for k in range(10)}
    list(prune(metas, [store(2, 3), store(8)]))  # 0, 1 older; 4-7 and 9 held by no row
    assert list(metas) == [2, 3, 8]
    metas = {k: _meta(k) for k in range(10)}
    assert list(prune(metas, [store(5, 6, 7, 8, 9)])) == []  # the older half let go: the cheap pass, one piece
    assert list(metas) == [5, 6, 7, 8, 9]
    list(prune(metas, []))
    assert metas == {}


def test_the_full_prune_pass_runs_in_pieces_of_bounded_rows_and_keys(monkeypatch):
    """Each piece of the full pass gathers the keys of the stores holding PRUNE_PIECE rows together (or
    of one larger store) or looks at PRUNE_PIECE metas, so the drain thread hands the GIL over between."""
    from array import array

    from sglang_ctxprof.aggregate import request_rows
    from sglang_ctxprof.aggregate.request_rows import prune

    monkeypatch.setattr(request_rows, "PRUNE_PIECE", 4)

    def store(*keys: int) -> array:
        return array("q", [c for k in keys for c in (k, 1, 1, 1)])

    metas = {k: _meta(k) for k in range(40)}
    stores = [store(0), store(*range(10, 13)), store(*range(20, 29)), store(30, 31)]  # 1 + 3 + 9 + 2 rows
    seen = []
    for _ in prune(metas, stores):
        seen.append(len(metas))
    # the sizes; gathering: [0, 10-12] (4 rows), [20-28] (one larger store), [30, 31]; then 40 keys, 4 a piece
    assert len(seen) == 1 + 3 + 10 and seen[:4] == [40, 40, 40, 40]
    assert list(metas) == [0, 10, 11, 12, *range(20, 29), 30, 31]
