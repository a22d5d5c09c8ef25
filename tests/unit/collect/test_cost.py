"""collect/cost.py: the profiler's own cost per step, and no share before a step is timed."""

from __future__ import annotations

import pytest

from sglang_ctxprof.collect.cost import SAMPLE_EVERY, Cost


def test_no_share_before_a_step_is_timed_then_the_shares_add_up():
    c = Cost()
    c.add_drain(8_000_000)  # records drained before the first timed step: 8 ms each
    d = c.to_dict()
    assert d["drain_us_per_record"] == pytest.approx(8000.0)
    assert d["step_share"] is None and d["drain_share"] is None and d["total_share"] is None
    for _ in range(SAMPLE_EVERY):
        c.sample()
    c.add_sched(40_000)
    c.add_step(20.0, None)
    d = c.to_dict()
    assert d["step_share"] == pytest.approx(40 / 20_000) and d["drain_share"] == pytest.approx(8000 / 20_000)
    assert d["total_share"] == pytest.approx(d["step_share"] + d["drain_share"])
