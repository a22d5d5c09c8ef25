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
from sglang_ctxprof.model.records import RankId


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
