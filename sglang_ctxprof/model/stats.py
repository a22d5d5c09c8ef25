"""Bounded-memory statistics: a log-bucketed duration histogram and a streaming least-squares fit.

* :class:`DurationStats` keeps count, total, min, max and a sparse log histogram (bins grow by 2%),
  so p50/p90/p99 are within ~1% of the exact value and memory is bounded by the number of distinct
  bins (at most ~1,200 between 1 us and 1,000 s), whatever the run length.
* :class:`LinearFit` keeps the five sums of ordinary least squares, so ``y = a*x + b`` over all
  observed points costs O(1) memory and merges across ranks exactly.

* :class:`PointSample` keeps a bounded, deterministic reservoir of (x, y) points, and
  :func:`theil_sen` fits a line robust to outliers on them (the median of pairwise slopes), so one
  362 ms warm-up step among 60 ms steps does not turn the context slope around.

All export to and import from builtins with string keys (msgpack-safe) and merge; a
:class:`FitMemo`, owned and handed in by a caller that rebuilds often, remembers recent Theil-Sen
fits by their points (no memo is kept here: a call without one computes).
Pure: the standard library, and numpy for the pairwise slopes of :func:`theil_sen` (the same
IEEE operations in the same order on each pair, so the very same result as the Python loop).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from itertools import chain
from typing import Any, Mapping, Optional

_GROWTH = 1.02
_LOG_G = math.log(_GROWTH)
_MIN_MS = 1e-3  # values below 1 us share bin 0


def _bin(ms: float) -> int:
    if ms <= _MIN_MS:
        return 0
    return int(math.log(ms / _MIN_MS) / _LOG_G) + 1


def _bin_mid(b: int) -> float:
    if b == 0:
        return 0.0
    lo = _MIN_MS * _GROWTH ** (b - 1)
    return lo * math.sqrt(_GROWTH)


class DurationStats:
    __slots__ = ("count", "total", "min", "max", "bins")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = 0.0
        self.bins: dict[int, int] = {}

    def add(self, ms: float) -> None:
        self.count += 1
        self.total += ms
        if ms < self.min:
            self.min = ms
        if ms > self.max:
            self.max = ms
        b = _bin(ms)
        self.bins[b] = self.bins.get(b, 0) + 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= rank:
                return min(max(_bin_mid(b), self.min), self.max)
        return self.max

    def summary(self) -> dict[str, float]:
        return {
            "count": self.count,
            "mean_ms": self.mean,
            "p50_ms": self.quantile(0.50),
            "p90_ms": self.quantile(0.90),
            "p99_ms": self.quantile(0.99),
            "total_ms": self.total,
        }

    def merge(self, other: "DurationStats") -> None:
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        for b, c in other.bins.items():
            self.bins[b] = self.bins.get(b, 0) + c

    def copy(self) -> "DurationStats":
        d = DurationStats()
        d.count, d.total, d.min, d.max, d.bins = self.count, self.total, self.min, self.max, dict(self.bins)
        return d

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self.count,
            "sum": self.total,
            "min": self.min if self.count else 0.0,
            "max": self.max,
            "bins": {str(b): c for b, c in self.bins.items()},
        }

    @classmethod
    def from_state(cls, s: Mapping[str, Any]) -> "DurationStats":
        d = cls()
        d.count = int(s.get("n", 0))
        d.total = float(s.get("sum", 0.0))
        d.min = float(s.get("min", 0.0)) if d.count else math.inf
        d.max = float(s.get("max", 0.0))
        d.bins = {int(b): int(c) for b, c in (s.get("bins") or {}).items()}
        return d


class LinearFit:
    """Streaming ordinary least squares of y against x.

    Kept as the count, the means and the centred co-moments (Welford's update, Chan's merge), not as
    raw power sums: ``n*sxx - sx**2`` cancels catastrophically when x barely varies, and then the fit
    of merged ranks would depend on the order they were merged in.  The wire state carries the same
    numbers; a state with raw sums (``sx``, ``sxx``, ...) is still read."""

    __slots__ = ("n", "mx", "my", "cxx", "cxy", "cyy")

    def __init__(self) -> None:
        self.n = 0
        self.mx = self.my = self.cxx = self.cxy = self.cyy = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        dx = x - self.mx
        dy = y - self.my
        self.mx += dx / self.n
        self.my += dy / self.n
        self.cxx += dx * (x - self.mx)
        self.cxy += dx * (y - self.my)
        self.cyy += dy * (y - self.my)

    def merge(self, o: "LinearFit") -> None:
        if o.n == 0:
            return
        n = self.n + o.n
        dx, dy = o.mx - self.mx, o.my - self.my
        w = self.n * o.n / n
        self.cxx += o.cxx + dx * dx * w
        self.cxy += o.cxy + dx * dy * w
        self.cyy += o.cyy + dy * dy * w
        self.mx += dx * o.n / n
        self.my += dy * o.n / n
        self.n = n

    def solve(self) -> dict[str, float] | None:
        """Return slope, intercept and r2, or None when x does not vary (a fit is meaningless)."""
        if self.n < 2 or self.cxx <= 1e-12 * max(1.0, self.mx * self.mx * self.n):
            return None
        slope = self.cxy / self.cxx
        intercept = self.my - slope * self.mx
        ss_res = max(0.0, self.cyy - slope * self.cxy)
        r2 = 1.0 - ss_res / self.cyy if self.cyy > 1e-18 else 1.0
        return {"slope": slope, "intercept": intercept, "r2": max(0.0, min(1.0, r2)), "n": self.n}

    def copy(self) -> "LinearFit":
        f = LinearFit()
        f.merge(self)
        return f

    def to_state(self) -> dict[str, float]:
        return {"n": self.n, "mx": self.mx, "my": self.my, "cxx": self.cxx, "cxy": self.cxy, "cyy": self.cyy}

    @classmethod
    def from_state(cls, s: Mapping[str, Any]) -> "LinearFit":
        f = cls()
        f.n = n = int(s.get("n", 0))
        if "sx" in s and n > 0:  # raw power sums (an older snapshot)
            sx, sy = float(s.get("sx", 0.0)), float(s.get("sy", 0.0))
            f.mx, f.my = sx / n, sy / n
            f.cxx = float(s.get("sxx", 0.0)) - sx * sx / n
            f.cxy = float(s.get("sxy", 0.0)) - sx * sy / n
            f.cyy = float(s.get("syy", 0.0)) - sy * sy / n
            return f
        for k in ("mx", "my", "cxx", "cxy", "cyy"):
            setattr(f, k, float(s.get(k, 0.0)))
        return f


def _spread(points: list[tuple[float, float]], n: int) -> list[tuple[float, float]]:
    """``n`` of ``points`` evenly spread (all of them when there are no more than ``n``, none for
    ``n <= 0``: a side whose steps round to no point)."""
    if len(points) <= n:
        return points
    if n <= 0:
        return []
    step = len(points) / n
    return [points[int(i * step)] for i in range(n)]


class PointSample:
    """A bounded uniform sample of (x, y) points (reservoir sampling with a fixed seed)."""

    __slots__ = ("cap", "seen", "points", "_state")

    def __init__(self, cap: int = 512) -> None:
        self.cap = max(2, cap)
        self.seen = 0
        self.points: list[tuple[float, float]] = []
        self._state = 0x2545F491

    def _rand(self, n: int) -> int:
        # xorshift32: deterministic and cheap, so runs and tests reproduce
        s = self._state
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self._state = s
        return s % n

    def add(self, x: float, y: float) -> None:
        self.seen += 1
        if len(self.points) < self.cap:
            self.points.append((x, y))
            return
        j = self._rand(self.seen)
        if j < self.cap:
            self.points[j] = (x, y)

    def merge(self, o: "PointSample") -> None:
        """Add ``o`` (another rank's sample): each side keeps points in proportion to what it saw, at
        the coarser side's steps per point, so a rank that saw few steps weighs in the union as
        little as it does in the steps; at most ``8 * cap`` points in all (ranks merged in turn)."""
        a, b = self.points, o.points
        if a and b:
            per = max(self.seen / len(a), o.seen / len(b))  # steps one kept point stands for
            a, b = _spread(a, round(self.seen / per)), _spread(b, round(o.seen / per))
        self.seen += o.seen
        self.points = _spread(a + b, self.cap * 8)  # stays bounded however many ranks merge

    def copy(self) -> "PointSample":
        c = PointSample(self.cap)
        c.seen, c.points, c._state = self.seen, list(self.points), self._state
        return c

    def to_state(self) -> dict[str, Any]:
        """``xy``: the points flat, x0, y0, x1, y1...: one list of floats, not one list per point.
        A state crosses from the scheduler to SGLang's HTTP process on every profile read and lives
        through the build there; hundreds of point lists each time were promoted to the oldest GC
        generation and brought on full collections of SGLang's heap, which one flat list does not."""
        return {"seen": self.seen, "xy": list(chain.from_iterable(self.points))}

    @classmethod
    def from_state(cls, s: Mapping[str, Any], cap: int = 512) -> "PointSample":
        """From ``to_state``, or from a state of before ``xy`` (``points``: [[x, y], ...])."""
        c = cls(cap)
        c.seen = int(s.get("seen", 0))
        xy = s.get("xy")
        if xy is not None:
            v = list(map(float, xy))
            c.points = list(zip(v[0::2], v[1::2]))
        else:
            c.points = [(float(x), float(y)) for x, y in (s.get("points") or [])]
        return c


def _median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _pair_slopes_py(pts: list[tuple[float, float]], eps: float) -> list[float]:
    """Every slope between two points of ``pts`` (sorted by x) whose x differ by more than ``eps``."""
    slopes = []
    for i in range(len(pts)):
        xi, yi = pts[i]
        for j in range(i + 1, len(pts)):
            dx = pts[j][0] - xi
            if dx > eps:
                slopes.append((pts[j][1] - yi) / dx)
    return slopes


def _median_slope(pts: list[tuple[float, float]], eps: float) -> float | None:
    """The median of :func:`_pair_slopes_py`, computed with numpy (None when there is no pair)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with SGLang
        s = _pair_slopes_py(pts, eps)
        return _median(s) if s else None
    if len(pts) < 2:
        return None
    a = np.asarray(pts, dtype=np.float64)
    x, y = a[:, 0], a[:, 1]
    dx = x[None, :] - x[:, None]  # [i, j] = x_j - x_i: the loop's pairs are i < j
    keep = np.triu(dx > eps, 1)
    s = (y[None, :] - y[:, None])[keep] / dx[keep]
    n = len(s)
    if not n:
        return None
    if n % 2:
        return float(np.partition(s, n // 2)[n // 2])
    lo, hi = np.partition(s, (n // 2 - 1, n // 2))[n // 2 - 1:n // 2 + 1]
    return 0.5 * (float(lo) + float(hi))


FITS_KEPT = 64  # recent fits a FitMemo remembers (a profile has at most ~9; the diagnosis a few more)

Fit = Optional[dict[str, float]]


class FitMemo:
    """The last ``kept`` Theil-Sen fits, remembered by their exact points, in order: a reservoir
    (:class:`PointSample`) that has seen many steps keeps its points for most of the next ones, so
    a profile rebuilt every few steps by the owner of this memo (the HTTP process's build cache)
    refits only the samples that changed.  Thread-safe (readers on several threads may share one)."""

    def __init__(self, kept: int = FITS_KEPT) -> None:
        self.kept = kept
        self._fits: OrderedDict[tuple, Fit] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fits)

    def clear(self) -> None:
        with self._lock:
            self._fits.clear()

    def fit(self, points: list[tuple[float, float]], max_points: int) -> Fit:
        try:
            key = (tuple(points), max_points)
            hash(key)
        except TypeError:  # points that are not tuples of numbers: fitted, not remembered
            return _theil_sen(points, max_points)
        with self._lock:
            if key in self._fits:
                self._fits.move_to_end(key)
                return self._fits[key]
        out = _theil_sen(points, max_points)
        with self._lock:
            self._fits[key] = out
            while len(self._fits) > self.kept:
                self._fits.popitem(last=False)
        return out


def theil_sen(points: list[tuple[float, float]], max_points: int = 256,
              memo: Optional[FitMemo] = None) -> Fit:
    """Theil-Sen line through ``points``: slope = median of pairwise slopes (pairs with distinct x),
    intercept = median of y - slope*x; r2 of that line on all points.  None when x does not vary.
    Above ``max_points`` an evenly spaced subset (sorted by x) is used, so the cost stays bounded.
    With a ``memo`` a fit of the same points is taken from it (:class:`FitMemo`); without, it is
    computed.  The result is the caller's own dict."""
    if memo is None:
        return _theil_sen(points, max_points)
    out = memo.fit(points, max_points)
    return dict(out) if out is not None else None


def _theil_sen(points: list[tuple[float, float]], max_points: int) -> dict[str, float] | None:
    pts = sorted(points)
    if len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)]
    span = (pts[-1][0] - pts[0][0]) if pts else 0.0
    eps = 1e-9 * max(1.0, abs(span))
    slope = _median_slope(pts, eps)
    if slope is None:
        return None
    intercept = _median([y - slope * x for x, y in points])
    my = sum(y for _, y in points) / len(points)
    ss_tot = sum((y - my) * (y - my) for _, y in points)  # a product overflows to inf, ** raises
    ss_res = sum((y - intercept - slope * x) * (y - intercept - slope * x) for x, y in points)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-18 else 1.0
    return {"slope": slope, "intercept": intercept, "r2": max(0.0, min(1.0, r2)), "n": len(points)}
