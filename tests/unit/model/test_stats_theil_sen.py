"""model/stats.theil_sen: the numpy pairwise slopes give the very same fit as the Python loop."""

from __future__ import annotations

import random

from sglang_ctxprof.model import stats


def _reference(points, max_points=256):
    """theil_sen with the pure-Python pairwise loop (what it ran before numpy)."""
    pts = sorted(points)
    if len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)]
    span = (pts[-1][0] - pts[0][0]) if pts else 0.0
    eps = 1e-9 * max(1.0, abs(span))
    slopes = stats._pair_slopes_py(pts, eps)
    if not slopes:
        return None
    slope = stats._median(slopes)
    intercept = stats._median([y - slope * x for x, y in points])
    my = sum(y for _, y in points) / len(points)
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in points)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-18 else 1.0
    return {"slope": slope, "intercept": intercept, "r2": max(0.0, min(1.0, r2)), "n": len(points)}


def test_equal_to_the_python_loop_bit_for_bit():
    rng = random.Random(11)
    cases = [[], [(1.0, 2.0)], [(1.0, 2.0), (1.0, 3.0)], [(0.0, 1.0), (2.0, 5.0)],
             [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]]
    for n in (3, 4, 17, 255, 256, 257, 512, 4096):
        xs = [rng.choice([rng.uniform(0, 300), float(rng.randint(0, 40))]) for _ in range(n)]
        cases.append([(x, 0.4 + 0.013 * x + rng.gauss(0, 0.05) * (1 + x / 100)) for x in xs])
        cases.append([(float(rng.randint(0, 3)), rng.uniform(0, 1)) for _ in range(n)])  # many equal x
    for pts in cases:
        assert stats.theil_sen(pts) == _reference(pts), len(pts)


def test_even_and_odd_slope_counts_and_no_pair():
    assert stats._median_slope([(0.0, 0.0), (1.0, 1.0), (3.0, 2.0)], 1e-9) == stats._median(
        stats._pair_slopes_py([(0.0, 0.0), (1.0, 1.0), (3.0, 2.0)], 1e-9))
    four = [(0.0, 0.0), (1.0, 1.0), (2.0, 5.0), (3.0, 2.0)]
    assert stats._median_slope(four, 1e-9) == stats._median(stats._pair_slopes_py(four, 1e-9))
    assert stats._median_slope([(1.0, 0.0), (1.0, 5.0)], 1e-9) is None


def test_a_fit_is_remembered_by_its_exact_points_in_its_memo_and_handed_out_as_a_copy(monkeypatch):
    calls = []
    real = stats._theil_sen
    monkeypatch.setattr(stats, "_theil_sen", lambda p, m: calls.append(len(p)) or real(p, m))
    memo = stats.FitMemo()
    rng = random.Random(5)
    pts = [(rng.uniform(0, 100), rng.uniform(0, 10)) for _ in range(300)]
    a = stats.theil_sen(pts, memo=memo)
    a["slope"] = -1.0  # the caller's copy: the remembered fit is untouched
    b = stats.theil_sen(list(pts), memo=memo)
    assert b == _reference(pts) and calls == [300]
    changed = pts[:-1] + [(pts[-1][0], pts[-1][1] + 1.0)]  # a reservoir replaced one point
    assert stats.theil_sen(changed, memo=memo) == _reference(changed) and calls == [300, 300]
    assert stats.theil_sen(pts[::-1], memo=memo) == _reference(pts[::-1]) and len(calls) == 3  # order counts (sums)
    lists = [[x, y] for x, y in pts[:50]]  # not hashable: fitted each time, still right
    assert stats.theil_sen(lists, memo=memo) == _reference(lists) and len(calls) == 4
    for i in range(stats.FITS_KEPT + 5):
        stats.theil_sen([(0.0, 0.0), (1.0, float(i))], memo=memo)
    assert len(memo) == stats.FITS_KEPT


def test_without_a_memo_every_fit_is_computed_and_memos_share_nothing(monkeypatch):
    calls = []
    real = stats._theil_sen
    monkeypatch.setattr(stats, "_theil_sen", lambda p, m: calls.append(len(p)) or real(p, m))
    pts = [(float(x), 2.0 * x + (x % 3)) for x in range(40)]
    assert stats.theil_sen(pts) == stats.theil_sen(pts) == _reference(pts) and calls == [40, 40]
    one, other = stats.FitMemo(), stats.FitMemo()
    stats.theil_sen(pts, memo=one)
    stats.theil_sen(pts, memo=other)  # another owner's memo has not seen these points
    stats.theil_sen(pts, memo=one)
    assert calls == [40, 40, 40, 40] and len(one) == len(other) == 1
