"""``model/facts``: a step's plain facts pickle whole, and build the same record on either side.

The facts a drain in another process would receive must carry no request object and rebuild the
very record the drain thread builds from the live requests (``collect.host.HostFacts.record``).
"""

from __future__ import annotations

import pickle

from fakes import Req
from sglang_ctxprof.collect.host import HostFacts, IdCache
from sglang_ctxprof.model.facts import CARRIED, StepFacts
from sglang_ctxprof.model.names import KIND_DECODE, KIND_PREFILL
from sglang_ctxprof.model.records import RankId, validate


def host(kind=KIND_DECODE, fin=(False, True, False)) -> HostFacts:
    reqs = (Req("a", 100), Req("b", 700), Req("c", 30))
    h = HostFacts(IdCache(), 7, kind, "EAGLE", RankId(tp=1), kind == KIND_DECODE, reqs, [1, 5, 9],
                  [0, 2, 3], [4, 7, 9], [1, 3, 3], list(fin), [3, 2, 1], 4)
    h.step_ms, h.phases_ms, h.t_start_ns, h.timing = 2.5, {"draft": 1.0, "verify": 1.5}, 123, "cpu"
    return h


def test_facts_hold_no_request_object_and_pickle_whole():
    f = host().facts()
    assert f.rids == ("a", "b", "c") and f.prompt_lens == (100, 700, 30)
    back = pickle.loads(pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is StepFacts
    assert all(getattr(back, n) == getattr(f, n) for n in StepFacts.__slots__)
    assert not any(isinstance(getattr(f, n), Req) for n in StepFacts.__slots__)


def test_the_record_built_from_pickled_facts_is_the_drain_threads():
    for kind in (KIND_DECODE, KIND_PREFILL):
        expected = host(kind).record()
        assert expected is not None
        assert pickle.loads(pickle.dumps(host(kind).facts())).record() == expected


def test_books_and_overshoot_survive_the_hand_off():
    """The finished request's books travel; the overshoot row (``spec_verify_ct`` unmoved) is left out."""
    rec = pickle.loads(pickle.dumps(host().facts())).record()
    assert rec.rids == ("a", "b")  # c's verify count did not move: SGLang did not count it
    assert rec.finished == (False, True) and rec.books[1][:2] == (3, 7)
    assert rec.books[0] == (-1, -1, -1)


def test_every_carried_field_is_a_record_field_the_facts_keep():
    f = host().facts()
    rec = f.record()
    assert all(getattr(rec, n) == getattr(f, n) for n in CARRIED)


def _stages(item):
    """Run ``build`` until a record (or None) comes out: the objects each stage handed back."""
    seen = [item]
    while isinstance(seen[-1], (HostFacts, StepFacts)):
        seen.append(seen[-1].build())
    return seen


def _re_prefill() -> HostFacts:
    h = host(KIND_PREFILL)
    h.lens_pre = [0, 5, 0]  # b was retracted with 5 tokens out, and is prefilled again
    return h


def test_the_build_in_stages_is_the_whole_build_one_piece_at_a_time():
    """Host facts with their ids read, the plain facts, the plain facts with their columns, then the
    record: the very record ``record()`` builds in one go, for every kind of step; facts pickled
    between two stages rebuild it too."""
    for make in (host, lambda: host(fin=(False, False, False)), lambda: host(KIND_PREFILL), _re_prefill):
        expected = make().record()
        h = make()
        seen = _stages(h)
        assert [type(x).__name__ for x in seen] == ["HostFacts", "HostFacts", "StepFacts", "StepFacts", "StepRecord"]
        assert seen[1] is h and h.read == (("a", "b", "c"), (100, 700, 30))
        assert seen[3] is seen[2] and seen[2].columns is not None
        assert seen[-1] == expected
        assert pickle.loads(pickle.dumps(seen[2])).build() == expected  # pickled with its columns
    assert expected.committed == (0, 2, 0)  # the re-prefill's: emitted 7 - 5 before


def test_a_step_with_no_counted_row_builds_no_record_at_the_last_stage():
    h = host(fin=(False, False, False))
    h.vct_post = list(h.vct_pre)  # no verify count moved: SGLang counted no row
    seen = _stages(h)
    assert len(seen) == 5 and seen[-1] is None and h.record() is None


def test_a_prefill_row_sglang_skips_takes_its_cache_hit_and_trace_context_with_it():
    """Under overlap a request that finished at the step before rides the next prefill batch and
    SGLang skips its row (``done_pre``): the row's prompt cache hit and trace context leave with it,
    so the rows kept keep their own."""
    h = host(KIND_PREFILL, fin=(False, False, False))
    h.done_pre = [True, False, False]
    f = h.facts()
    f.cached_lens = (64, 0, 16)
    f.trace_parents = ("00-a-01", "00-b-01", "00-c-01")  # read from the requests by ``facts()``
    rec = f.record()
    assert rec.rids == ("b", "c")
    assert rec.cached_lens == (0, 16) and rec.trace_parents == ("00-b-01", "00-c-01")
    validate(rec)
