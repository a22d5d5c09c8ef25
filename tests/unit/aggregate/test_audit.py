"""aggregate/audit.py: each invariant, broken alone, raises its own counter and no other."""

from __future__ import annotations

import dataclasses

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.names import AUDIT_INVARIANTS
from sglang_ctxprof.model.records import RankId, StepRecord

PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}  # leaves sum to 5.0


def _prefill(rid: str, sid: int, fin: bool = False, books=()) -> StepRecord:
    return StepRecord(step_id=sid, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100,),
                      accepted=(0,), committed=(0,), finished=(fin,), draft_tokens=0, step_ms=20.0,
                      books=books)


def _decode(rid: str, sid: int, fin: bool = False, **kw) -> StepRecord:
    d = dict(step_id=sid, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100 + sid,),
             accepted=(3,), committed=(3,), finished=(fin,), draft_tokens=4, step_ms=5.0, phases_ms=dict(PH),
             t_start_ns=sid, timing="cpu")
    d.update(kw)
    return StepRecord(**d)


def _run(n: int = 5, fault: str = "", rid: str = "r") -> Aggregator:
    """One clean request of ``n`` decode steps, with one fault planted in step 3 or in the books."""
    agg = Aggregator()
    agg.observe(_prefill(rid, 0))
    books = ((n, 1 + 3 * n, 2 * n),)  # SGLang's spec_verify_ct, completion_tokens, spec_num_correct_drafts
    for i in range(1, n + 1):
        kw: dict = {}
        if i == 3 and fault == "leaf_sum":
            kw["phases_ms"] = {**PH, "draft": 1.5}  # our draft time skewed: leaves 5.5 > step 5.0
        if i == 3 and fault == "accepted_bound":
            kw["draft_tokens"] = 2  # a skewed draft count: 3 accepted > 1 position + 1 bonus
        if i == 3 and fault == "hook_once":  # MoE unhooked: no time lands in it, the rest absorbs it
            kw["phases_ms"] = {**PH, "verify_moe": 0.0, "verify_rest": 1.5}
        fin = i == n
        b = books
        if fin and fault == "verify_ct":
            b = ((n + 1, 1 + 3 * n, 2 * n),)  # the engine counted a verify we never saw
        if fin and fault == "completion_tokens":
            b = ((n, 2 + 3 * n, 2 * n),)  # a token committed that we never counted
        if fin and fault == "accept_metric":
            b = ((n, 1 + 3 * n, 2 * n - 2),)  # SGLang's correct-draft counter froze for a step
        agg.observe(_decode(rid, i, fin, books=b if fin else (), **kw))
    return agg


def test_a_clean_request_breaks_nothing():
    agg = _run()
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0)
    assert st["checked"] == {"steps": 5, "requests": 1} and st["latest"] == []


@pytest.mark.parametrize("inv", AUDIT_INVARIANTS)
def test_each_fault_raises_its_own_counter_and_no_other(inv):
    st = _run(fault=inv).audit.status()
    assert st["violations"] == {k: int(k == inv) for k in AUDIT_INVARIANTS}, st
    (v,) = st["latest"]
    assert v["invariant"] == inv and v["detail"]


def test_a_request_finished_at_prefill_and_a_retraction_reconcile():
    agg = Aggregator()
    agg.observe(_prefill("one", 0, fin=True, books=((-1, 1, 0),)))  # max_new_tokens=1
    agg.observe(_prefill("r", 1))
    agg.observe(_decode("r", 2))
    # retracted, then prefilled again with prompt + output: that prefill appends one token
    agg.observe(dataclasses.replace(_prefill("r", 3), committed=(1,)))
    agg.observe(_decode("r", 4, fin=True, books=((2, 1 + 3 + 1 + 3, 4),)))
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0) and st["checked"]["requests"] == 2


def test_an_unsampled_graph_step_counts_verify_whole_and_timings_learn_apart():
    agg = Aggregator()
    graph = {"draft": 1.0, "verify": 3.0, "draft_extend": 0.5, "overhead": 0.5}  # split left out
    for i in range(3):
        agg.observe(_decode("g", i, timing="cuda_graph_events"))
        agg.observe(_decode("g", 10 + i, phases_ms=graph, timing="cuda_graph"))
    assert agg.audit.status()["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0)


def test_latest_is_bounded_and_reset_clears_the_counts():
    agg = Aggregator()
    for i in range(40):
        agg.observe(_decode("x", i, phases_ms={**PH, "draft": 9.0}))
    st = agg.audit.status()
    assert st["violations"]["leaf_sum"] == 40 and len(st["latest"]) == 16
    agg.reset()
    assert agg.audit.status()["violations"]["leaf_sum"] == 0


def test_the_audit_can_be_left_out():
    agg = Aggregator(audit=False)
    agg.observe(_decode("x", 1))
    assert agg.audit is None and agg.records == 1


def test_an_aborted_request_is_no_violation_and_hides_none_of_a_normal_one():
    """A request SGLang aborted while it waited ends with no books (its steps need not match any
    spec_verify_ct); the audit checks it for nothing, and the next normal request's fault still counts."""
    from sglang_ctxprof.model.records import RequestEnd

    agg = _run(fault="verify_ct", rid="normal")
    agg.observe(_prefill("ab", 10))
    for i in range(11, 14):
        agg.observe(_decode("ab", i))
    agg.end_request(RequestEnd("ab", retracted=True, t_ns=99))
    agg.end_request(RequestEnd("never-ran", t_ns=100))
    agg.observe(_prefill("ab", 20))  # the rid used again: a new request, checked as any other
    agg.observe(_decode("ab", 21, fin=True, books=((2, 4, 2),)))  # one step, SGLang says 2
    st = agg.audit.status()
    assert st["violations"] == {k: 2 * int(k == "verify_ct") for k in AUDIT_INVARIANTS}, st
    assert [v["rid"] for v in st["latest"]] == ["normal", "ab"] and st["checked"]["requests"] == 2
    assert agg.snapshot().requests_aborted == 2


def test_a_request_evicted_and_brought_back_by_a_decode_step_is_not_checked():
    """A ring smaller than the live requests: ``a`` is evicted after its first decode step, and its
    last step adds it again with only that step.  Its totals are partial, so the audit checks it
    for nothing (as one evicted for good), and a whole request beside it is still checked."""
    agg = Aggregator(request_capacity=2)
    agg.observe(_prefill("a", 0))
    agg.observe(_decode("a", 1))
    agg.observe(_prefill("b", 2))
    agg.observe(_prefill("c", 3))  # the ring holds b and c: a is evicted
    agg.observe(_decode("a", 4, fin=True, books=((2, 7, 4),)))  # SGLang's books: 2 steps, 6 committed
    agg.observe(_decode("c", 5, fin=True, books=((1, 4, 2),)))
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0), st
    assert st["checked"]["requests"] == 1
    assert agg.requests.get("a")["steps"] == 1  # the summary is what the history saw, as before


def test_a_plain_decode_step_counts_its_forward_whole_without_its_split():
    agg = Aggregator()
    for i, ph in enumerate(({"decode": 4.0, "decode_attn": 2.0, "decode_moe": 1.0, "decode_rest": 1.0,
                             "overhead": 1.0}, {"decode": 4.0, "overhead": 1.0})):
        agg.observe(_decode("p", i, algorithm="NONE", accepted=(1,), committed=(1,), draft_tokens=0,
                            phases_ms=ph, timing=("cuda_events", "cuda_graph")[i]))
    assert agg.audit.status()["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0)


def test_accept_metric_counts_accepted_drafts_step_by_step_as_the_records_do():
    """Accepted drafts are ``records.accepted_drafts`` per step (never below 0), summed over the
    request's steps, kept rows and folded ones alike: a UNO step (two non-draft tokens) that accepted
    only one token adds no draft, it does not take one away from the others."""
    agg = Aggregator(max_steps_per_request=2)
    agg.observe(_prefill("u", 0))
    acc = (4, 1, 3, 4)  # drafts 2, 0, 1, 2: 5 (accepted - 2 x steps would say 4)
    for i, a in enumerate(acc, 1):
        agg.observe(_decode("u", i, fin=i == 4, algorithm="UNO", non_draft_tokens=2, accepted=(a,),
                            committed=(a,), books=((4, 1 + sum(acc), 5),) if i == 4 else ()))
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0), st
    assert st["checked"]["requests"] == 1


def test_a_request_that_keeps_no_output_at_its_prefill_reconciles():
    """``max_new_tokens=0`` (prompt scoring, and the prefix warm-up SGLang's tokenizer sends before
    every n>1 request) finishes at its prefill with ``completion_tokens`` 0: the prefill's token is
    not kept.  No violation; one that also counted decode tokens still is one."""
    agg = Aggregator()
    agg.observe(_prefill("zero", 0, fin=True, books=((-1, 0, 0),)))
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0) and st["checked"]["requests"] == 1
    agg.observe(_prefill("z2", 1))
    agg.observe(_decode("z2", 2, fin=True, books=((1, 0, 2),)))  # 3 committed, SGLang says 0
    assert agg.audit.status()["violations"]["completion_tokens"] == 1


def test_a_reused_rid_whose_prefill_went_unseen_is_a_new_use_and_not_checked():
    """The rid's first use finished; its second use's prefill ran while profiling was off (or its
    step was lost), so its first record is a decode step: a new use, partial (not summed into the
    finished one, which the audit would then check against the second use's books)."""
    agg = _run(rid="again")
    agg.requests.interrupt()  # profiling off, then on again
    for i in (20, 21):
        agg.observe(_decode("again", i, fin=i == 21, books=((5, 16, 10),) if i == 21 else ()))
    st = agg.audit.status()
    assert st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0), st
    assert st["checked"]["requests"] == 1
    new = agg.requests.get("again")
    assert new["use"] == 1 and new["steps"] == 2 and agg.requests.tally("again") is None
    assert agg.requests.finished("again", _decode("again", 5).end_ns)["steps"] == 5


def test_adaptive_speculation_that_skips_the_draft_at_zero_steps_is_no_missing_hook():
    """``--speculative-adaptive`` picks the draft steps per batch, 0 among them at large batches: such a
    step runs no draft (nor, optionally, draft_extend).  Its hooks are learned apart from the other
    depths', whichever comes first; a hook that stops firing at one depth still counts."""
    agg = Aggregator()
    no_draft = {"verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5, "overhead": 1.0}
    for i in range(1, 9):
        if i % 2:
            agg.observe(_decode("a", i, draft_tokens=1, phases_ms=dict(no_draft), step_ms=4.0, accepted=(1,),
                                committed=(1,)))
        else:
            agg.observe(_decode("a", i))
    assert agg.audit.status()["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0)
    agg.observe(_decode("a", 9, phases_ms={**PH, "verify_moe": 0.0, "verify_rest": 1.5}))
    assert agg.audit.status()["violations"]["hook_once"] == 1


def test_each_finished_request_is_checked_in_a_piece_of_its_own():
    """A request's books sum its kept rows (thousands for a long one): a batch that finishes together
    is checked one request a piece, the drain handing over between two, not in one long piece."""
    rids = tuple(f"r{k}" for k in range(4))

    def pieces(books) -> tuple[int, Aggregator]:
        agg = Aggregator()
        for rid in rids:
            agg.observe(_prefill(rid, 0))
        last = _decode("x", 1, rids=rids, ctx_lens=(101,) * 4, accepted=(3,) * 4, committed=(3,) * 4,
                       finished=(True,) * 4, books=books)
        return sum(1 for _ in agg.stages(last)), agg

    unchecked, _ = pieces(())
    checked, agg = pieces(((1, 4, 2),) * 4)
    assert checked == unchecked + 4
    st = agg.audit.status()
    assert st["checked"]["requests"] == 4 and st["violations"] == dict.fromkeys(AUDIT_INVARIANTS, 0), st["latest"]
