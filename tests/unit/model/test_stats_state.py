"""``PointSample``'s exported state: one flat list of floats however many points, so a profile
read (the state crosses from the scheduler to SGLang's HTTP process and lives through the build)
leaves no per-point container for the garbage collector to promote and walk; the points come back
the same, and a state written before (``points``: [[x, y], ...]) is still read."""

from __future__ import annotations

import gc
import json
import random

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.stats import PointSample


def _sample(n: int) -> PointSample:
    rng = random.Random(n)
    ps = PointSample(cap=512)
    for _ in range(n):
        ps.add(rng.uniform(100, 30000), rng.uniform(1, 90))
    return ps


def _wire(state):
    """The state as the HTTP process gets it: msgpack/JSON arrays arrive as lists."""
    return json.loads(json.dumps(state))


def _tracked(obj) -> int:
    """GC-tracked objects in ``obj``'s tree (``obj`` included)."""
    n = int(gc.is_tracked(obj))
    if isinstance(obj, dict):
        return n + sum(_tracked(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return n + sum(_tracked(v) for v in obj)
    return n


def test_state_holds_the_same_few_containers_for_8_or_512_points():
    small, big = _wire(_sample(8).to_state()), _wire(_sample(5000).to_state())
    assert len(PointSample.from_state(big).points) == 512
    assert _tracked(small) == _tracked(big) <= 2  # the dict and one list of floats


def test_snapshot_state_does_not_grow_in_containers_with_the_points():
    def fit_points(steps: int) -> int:
        agg = Aggregator()
        for s in range(steps):
            ctx = (100 + 37 * s % 20000, 500 + 11 * s % 9000)
            agg.observe(StepRecord(step_id=s, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a", "b"),
                                   ctx_lens=ctx, accepted=(3, 2), committed=(3, 2), finished=(False, False),
                                   draft_tokens=4, step_ms=3.0 + s % 5, t_start_ns=s * 10_000_000, timing="cpu",
                                   phases_ms={"draft": 1.0, "verify": 1.5 + s % 3, "draft_extend": 0.5}))
        d = _wire(agg.snapshot(with_requests=False).to_dict())
        assert sum(len(PointSample.from_state(v).points) for v in d["fit_points"].values()) >= min(steps, 512)
        return _tracked(d["fit_points"])

    assert fit_points(2000) == fit_points(40)


def test_points_come_back_the_same():
    ps = _sample(700)
    back = PointSample.from_state(_wire(ps.to_state()))
    assert back.points == ps.points and back.seen == ps.seen == 700


def test_a_state_of_before_is_read():
    old = {"seen": 3, "points": [[1.0, 2.0], [3.0, 4.5], [5, 6]]}
    ps = PointSample.from_state(old)
    assert ps.points == [(1.0, 2.0), (3.0, 4.5), (5.0, 6.0)] and ps.seen == 3
