"""Context-length bucketing.

A bucket is a half-open token range ``[lo, hi)``.  Three layouts:

* ``pow2`` (default): ``[0,64) [64,128) [128,256) ... [2^k, 2^(k+1))`` up to the max context;
* ``fixed:<width>``: equal-width ranges (``fixed:1024`` -> ``[0,1024) [1024,2048) ...``), at most
  ``MAX_BUCKETS`` of them, so a narrow width ends before the max context (``fixed:1024``: ``261120+``);
* ``edges:a,b,c``: explicit boundaries.

The number of buckets is bounded (``MAX_BUCKETS``; an ``edges:`` list longer than that is refused), so
labels used as Prometheus labels and dictionary keys keep a bounded cardinality.  Contexts beyond the last edge go to an open-ended
last bucket.  Pure; imports only the standard library.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Mapping

MAX_BUCKETS = 256
DEFAULT_MAX_CTX = 1 << 20


@dataclass(frozen=True)
class Bucketing:
    spec: str
    edges: tuple[int, ...]  # sorted lower bounds, edges[0] == 0

    @classmethod
    def parse(cls, spec: str | None, max_ctx: int = DEFAULT_MAX_CTX) -> "Bucketing":
        spec = (spec or "pow2").strip()
        if spec == "pow2":
            edges = [0, 64]
            while edges[-1] * 2 <= max_ctx:
                edges.append(edges[-1] * 2)
        elif spec.startswith("fixed:"):
            try:
                width = int(spec.split(":", 1)[1])
            except ValueError:
                raise ValueError(f"bad bucket spec {spec!r}: fixed:<width> needs an integer width") from None
            if width <= 0:
                raise ValueError(f"bad bucket spec {spec!r}: width must be > 0")
            n = min(MAX_BUCKETS, max_ctx // width + 1)
            edges = [i * width for i in range(n)]
        elif spec.startswith("edges:"):
            try:
                edges = sorted({int(x) for x in spec.split(":", 1)[1].split(",") if x.strip()})
            except ValueError:
                raise ValueError(f"bad bucket spec {spec!r}: edges:<a>,<b>,... needs integers") from None
            if not edges or edges[0] < 0:
                raise ValueError(f"bad bucket spec {spec!r}: edges must be >= 0")
            if edges[0] != 0:
                edges = [0] + edges
        else:
            raise ValueError(f"bad bucket spec {spec!r}: use pow2, fixed:<width> or edges:<a>,<b>,...")
        if len(edges) > MAX_BUCKETS:
            raise ValueError(f"bucket spec {spec!r} gives {len(edges)} buckets (max {MAX_BUCKETS})")
        return cls(spec, tuple(edges))

    def index(self, ctx: float) -> int:
        return max(0, bisect.bisect_right(self.edges, ctx) - 1)

    def bounds(self, i: int) -> tuple[int, int | None]:
        hi = self.edges[i + 1] if i + 1 < len(self.edges) else None
        return self.edges[i], hi

    def label(self, i: int) -> str:
        lo, hi = self.bounds(i)
        return f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "edges": list(self.edges)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Bucketing":
        return cls(str(d.get("spec", "pow2")), tuple(int(e) for e in d["edges"]))
