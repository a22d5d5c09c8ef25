"""StepRecord's builtins form is derived from its fields: every field travels, the JSON is the one
saved profiles carry (key order included), and a record saved before newer fields existed loads."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from sglang_ctxprof.model.records import RankId, StepRecord

FULL = StepRecord(step_id=7, kind="prefill", algorithm="EAGLE", rank=RankId(1, 2, 3), rids=("a", "b"),
                  ctx_lens=(10, 20), accepted=(0, 0), committed=(0, 1), finished=(False, True),
                  draft_tokens=4, step_ms=2.5, phases_ms={"prefill": 2.5}, t_start_ns=11, timing="cuda_events",
                  trace_parents=("tp-a", ""), block_size=3, denoise_steps=2, non_draft_tokens=2,
                  exec_mode="graph", attn_backend="fa3", t_end_ns=99, draft_depth=3, exec_reason="why",
                  cached_lens=(4, 0), books=((-1, -1, -1), (5, 6, 3)))

# The JSON a saved profile holds for FULL, byte for byte (the layout before to_dict was derived, plus
# ``books``, the one field added since: a saved record without it reads back with ``()``).
SAVED = ('{"step_id": 7, "kind": "prefill", "algorithm": "EAGLE", "rank": {"tp": 1, "dp": 2, "pp": 3}, '
         '"batch_size": 2, "rids": ["a", "b"], "ctx_lens": [10, 20], "accepted": [0, 0], "committed": [0, 1], '
         '"finished": [false, true], "draft_tokens": 4, "step_ms": 2.5, "phases_ms": {"prefill": 2.5}, '
         '"t_start_ns": 11, "timing": "cuda_events", "trace_parents": ["tp-a", ""], "block_size": 3, '
         '"denoise_steps": 2, "non_draft_tokens": 2, "exec_mode": "graph", "attn_backend": "fa3", '
         '"t_end_ns": 99, "draft_depth": 3, "exec_reason": "why", "cached_lens": [4, 0], '
         '"books": [[-1, -1, -1], [5, 6, 3]]}')


def test_to_dict_is_byte_compatible_with_saved_records():
    assert json.dumps(FULL.to_dict()) == SAVED


def test_every_field_travels_and_comes_back():
    d = FULL.to_dict()
    assert [k for k in d if k != "batch_size"] == [f.name for f in fields(StepRecord)]
    assert StepRecord.from_dict(json.loads(json.dumps(d))) == FULL


def test_an_old_record_takes_the_defaults():
    r = StepRecord.from_dict({"step_id": 1, "rids": ["x", "y"], "non_draft_tokens": 0, "block_size": None})
    assert (r.kind, r.algorithm, r.rank) == ("decode", "", RankId())
    assert (r.accepted, r.committed, r.finished) == ((0, 0), (0, 0), (False, False))
    assert (r.non_draft_tokens, r.block_size, r.timing, r.cached_lens) == (1, 0, "cpu", ())
    with pytest.raises(KeyError):
        StepRecord.from_dict({"rids": []})
