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
                  cached_lens=(4, 0), books=((-1, -1, -1), (5, 6, 3)), prompt_lens=(10, 12), retractions=(0, 1))

# The JSON a saved profile holds for FULL, byte for byte (the layout before to_dict was derived, plus
# ``books``, ``prompt_lens`` and ``retractions``, the fields added since: a saved record without them
# reads back with ``()``).
SAVED = ('{"step_id": 7, "kind": "prefill", "algorithm": "EAGLE", "rank": {"tp": 1, "dp": 2, "pp": 3}, '
         '"batch_size": 2, "rids": ["a", "b"], "ctx_lens": [10, 20], "accepted": [0, 0], "committed": [0, 1], '
         '"finished": [false, true], "draft_tokens": 4, "step_ms": 2.5, "phases_ms": {"prefill": 2.5}, '
         '"t_start_ns": 11, "timing": "cuda_events", "trace_parents": ["tp-a", ""], "block_size": 3, '
         '"denoise_steps": 2, "non_draft_tokens": 2, "exec_mode": "graph", "attn_backend": "fa3", '
         '"t_end_ns": 99, "draft_depth": 3, "exec_reason": "why", "cached_lens": [4, 0], '
         '"books": [[-1, -1, -1], [5, 6, 3]], "prompt_lens": [10, 12], '
         '"retractions": [0, 1]}')


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
    assert (r.non_draft_tokens, r.block_size, r.timing, r.cached_lens, r.prompt_lens, r.retractions) == \
        (1, 0, "cpu", (), (), ())
    with pytest.raises(KeyError):
        StepRecord.from_dict({"rids": []})


def test_reported_phases_are_what_phase_reads_in_reported_order_and_the_shape_cache_is_the_callers():
    from sglang_ctxprof.model import records
    from sglang_ctxprof.model.names import REPORTED_PHASES

    def rec(ph: dict, step_ms: float = 7.0) -> StepRecord:
        return StepRecord(step_id=1, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(10,),
                          accepted=(1,), committed=(1,), finished=(False,), draft_tokens=2, step_ms=step_ms,
                          phases_ms=ph)

    ph = {"verify": 3, "draft": 1.5, "not_a_phase": 9.0, "verify_attn": 2.0}  # any order, an int, a stranger
    r = rec(ph)
    shapes: dict = {}
    got = list(r.reported_phases(shapes))
    assert got == [(n, r.phase(n)) for n in REPORTED_PHASES if n == "step" or n in ph]
    assert got == [("step", 7.0), ("draft", 1.5), ("verify", 3.0), ("verify_attn", 2.0)]
    assert all(type(ms) is float for _, ms in got[1:])
    assert list(shapes) == [tuple(ph)] and list(r.reported_phases(shapes)) == got  # the same shape: one entry
    for other in ({}, {"draft": 0.5}, {"decode": 2.0, "decode_attn": 1.0, "x": 1.0}):  # none, one, several
        o = rec(other, 4.0)
        assert list(o.reported_phases(shapes)) == [(n, o.phase(n)) for n in REPORTED_PHASES
                                                   if n == "step" or n in other]
    assert len(shapes) == 4
    full: dict = {(str(i),): ((), None) for i in range(records.SHAPES_KEPT)}
    assert list(r.reported_phases(full)) == got and len(full) == records.SHAPES_KEPT  # bounded: not kept


# A spec step split and unsplit (a CUDA graph's unsampled step), a plain decode step split and unsplit.
SPEC_SPLIT = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
              "draft_extend": 0.5, "overhead": 0.5}
SPEC_WHOLE = {"draft": 1.0, "verify": 3.0, "draft_extend": 0.5, "overhead": 0.5}
PLAIN_SPLIT = {"decode": 9.0, "decode_attn": 4.0, "decode_moe": 3.0, "decode_rest": 2.0, "overhead": 1.0}
PLAIN_WHOLE = {"decode": 9.0, "overhead": 1.0}


@pytest.mark.parametrize("ph, want", [
    (SPEC_SPLIT, ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead")),
    (SPEC_WHOLE, ("draft", "verify", "draft_extend", "overhead")),
    (PLAIN_SPLIT, ("decode_attn", "decode_moe", "decode_rest", "overhead")),
    (PLAIN_WHOLE, ("decode", "overhead")),
], ids=["spec-split", "spec-whole", "plain-split", "plain-whole"])
def test_a_forward_counts_whole_without_its_split_and_by_its_parts_with_it(ph, want):
    r = StepRecord(step_id=1, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(10,),
                   accepted=(1,), committed=(1,), finished=(False,), draft_tokens=2,
                   step_ms=sum(ph[p] for p in want), phases_ms=ph)
    assert r.leaf_sum_ms() == r.step_ms
    from sglang_ctxprof.model.records import leaf_ms, leaf_phases

    assert set(leaf_phases(ph)) == set(want) and leaf_ms(ph) == {p: ph[p] for p in want}
    assert leaf_phases({**ph, "step": 1.0, "host_gap": 1.0, "prefill": 1.0}) == leaf_phases(ph)


def test_what_sglang_dropped_at_the_last_step_counts_one_more_per_retraction():
    """The accounting rule: a retracted request's re-prefill commits one token with none accepted, so
    what SGLang dropped at the request's last step is sum(accepted) - sum(committed) plus one per
    retraction (the module docstring states it so)."""
    from sglang_ctxprof.aggregate.requests import RequestLog
    from sglang_ctxprof.model import records

    def rec(i: int, kind: str, acc: int, com: int) -> StepRecord:
        return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(10,),
                          accepted=(acc,), committed=(com,), finished=(i == 3,), draft_tokens=4, step_ms=1.0)

    log = RequestLog()
    # prefill; a step of 3; retracted and prefilled again (1 token); the last step accepts 3, keeps 1
    for r in (rec(0, "prefill", 0, 0), rec(1, "decode", 3, 3), rec(2, "prefill", 0, 1), rec(3, "decode", 3, 1)):
        log.observe(r)
    a = log.get("a")
    assert a["accepted"] - a["committed"] + a["retractions"] == 2 and a["retractions"] == 1
    assert "plus one per retraction" in " ".join(records.__doc__.split())


def test_accepted_drafts_sum_is_accepted_drafts_step_by_step():
    from sglang_ctxprof.model.records import accepted_drafts, accepted_drafts_sum

    from array import array

    acc = [0, 1, 2, 5, 1, 3, 2, 0]
    for nd in (1, 2, 3):
        assert accepted_drafts_sum(array("q", acc), nd) == sum(accepted_drafts(a, nd) for a in acc)
    assert accepted_drafts_sum(acc, 2) == 0 + 0 + 0 + 3 + 0 + 1 + 0 + 0 and accepted_drafts_sum((), 2) == 0


def test_host_gap_is_measured_between_steps_never_across_idle_time_or_a_break():
    from sglang_ctxprof.model.records import HostGap

    def rec(start_ms, ms, fin=False):
        return StepRecord(step_id=0, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(9,),
                          accepted=(1,), committed=(1,), finished=(fin,), draft_tokens=0, step_ms=ms,
                          t_start_ns=int(start_ms * 1e6))

    g = HostGap()
    assert g.take(rec(10, 5)) is None  # the first step: nothing before it
    assert g.take(rec(17, 5)) == pytest.approx(2.0)  # 10 + 5 -> 17
    assert g.take(rec(30, 5, fin=True)) == pytest.approx(8.0)  # its requests all finish here
    assert g.take(rec(500, 5)) is None  # the server sat idle: no gap
    g.brk()
    assert g.take(rec(600, 5)) is None  # steps went unrecorded
    assert g.take(rec(606, 5)) == pytest.approx(1.0)
    no_clock = StepRecord(step_id=0, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(9,),
                          accepted=(1,), committed=(1,), finished=(False,), draft_tokens=0, step_ms=1.0)
    assert g.take(no_clock) is None
    assert g.take(rec(613, 1)) == pytest.approx(2.0)  # a record with no host clock changes nothing
