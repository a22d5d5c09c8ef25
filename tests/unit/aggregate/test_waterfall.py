"""aggregate/waterfall.py: a request's own steps are charged by their leaf phases, whatever split
they carry (``records.leaf_phases``), so the waterfall adds up to the wall time."""

from __future__ import annotations

import pytest

from sglang_ctxprof.aggregate.recent import RecentStep
from sglang_ctxprof.aggregate.waterfall import waterfall
from sglang_ctxprof.model.buckets import Bucketing

MS = 10**6
SPEC_WHOLE = {"draft": 1.0, "verify": 7.0, "draft_extend": 1.0, "overhead": 1.0}
PLAIN_SPLIT = {"decode": 9.0, "decode_attn": 4.0, "decode_moe": 3.0, "decode_rest": 2.0, "overhead": 1.0}
PLAIN_WHOLE = {"decode": 9.0, "overhead": 1.0}  # a CUDA graph's plain decode: no attention/MoE split


@pytest.mark.parametrize("ph", [SPEC_WHOLE, PLAIN_SPLIT, PLAIN_WHOLE], ids=["spec-whole", "plain-split", "plain-whole"])
def test_own_steps_are_their_leaf_phases_and_nothing_is_unaccounted(ph):
    rows = [{"step_id": i, "t_start_ns": i * 10 * MS, "t_end_ns": (i + 1) * 10 * MS, "step_ms": 10.0,
             "ctx_len": 100, "batch_size": 1, "phases_ms": dict(ph)} for i in range(1, 4)]
    timeline = [RecentStep(r["step_id"], "decode", r["t_start_ns"], r["t_end_ns"], 10.0, None) for r in rows]
    w = waterfall(rows, timeline, {}, Bucketing.parse("pow2"))
    assert w["own_steps_total_ms"] == pytest.approx(30.0) and w["unaccounted_ms"] == pytest.approx(0.0)
    assert "decode" in w["own_steps_ms"] if ph is PLAIN_WHOLE else "decode" not in w["own_steps_ms"]


def test_bucketing_is_typed_as_the_package_type():
    from typing import get_type_hints

    assert get_type_hints(waterfall)["bucketing"] is Bucketing
