"""model/stats.py: ``PointSample.merge`` keeps each rank's points in proportion to the steps it saw.

A fit over the merged points (Theil-Sen, ``/ctx_profile``'s ``fits``) must weigh a rank by its
steps, not by its points: a rank that saw 10 steps keeps 10 points, as many as one that saw 10^6.
"""

from __future__ import annotations

from sglang_ctxprof.model.stats import PointSample


def _sample(n: int, y: float, x0: float = 0.0) -> PointSample:
    s = PointSample(cap=512)
    for i in range(n):
        s.add(x0 + i % 97, y)
    return s


def test_a_rank_that_saw_few_steps_keeps_few_points_in_the_union():
    busy, idle = _sample(100_000, 1.0), _sample(1_000, 100.0)  # 512 points each
    busy.merge(idle)
    ys = [y for _, y in busy.points]
    assert busy.seen == 101_000
    assert ys.count(100.0) == 5 and ys.count(1.0) == 512  # 1,000 steps at ~195 steps a point


def test_ranks_that_saw_alike_keep_all_their_points_and_the_union_stays_bounded():
    a, b = _sample(800, 1.0), _sample(800, 2.0)
    a.merge(b)
    assert len(a.points) == 1024 and a.seen == 1600
    for y in range(3, 12):  # more ranks merged in turn: at most 8 x cap points
        a.merge(_sample(800, float(y)))
    assert len(a.points) == 8 * 512 and a.seen == 800 * 11


def test_an_empty_side_changes_nothing_but_the_count():
    a, empty = _sample(10, 1.0), PointSample(cap=512)
    a.merge(empty)
    assert len(a.points) == 10 and a.seen == 10
    empty.merge(a)
    assert len(empty.points) == 10 and empty.seen == 10


def test_a_rank_too_small_for_one_point_keeps_none_and_the_merge_stands():
    """3,000 steps at ~6 steps a point against 1 step: the idle rank rounds to no point (its steps
    still count); a merge must not divide by zero, since every profile read of the ranks merges."""
    busy, idle = _sample(3_000, 1.0), _sample(1, 100.0)
    busy.merge(idle)
    assert busy.seen == 3_001 and len(busy.points) == 512 and {y for _, y in busy.points} == {1.0}
    idle = _sample(1, 100.0)
    idle.merge(_sample(3_000, 1.0))  # either side first
    assert idle.seen == 3_001 and len(idle.points) == 512
