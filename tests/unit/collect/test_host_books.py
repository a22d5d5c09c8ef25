"""collect/host.py: a finished request's record carries SGLang's own books for the self-audit."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_ctxprof.collect.host import HostFacts, IdCache
from sglang_ctxprof.model.records import RankId


def _req(rid, out, vct, correct, fin):
    return SimpleNamespace(rid=rid, origin_input_ids=[1] * 10, output_ids=[0] * out, spec_verify_ct=vct,
                           spec_num_correct_drafts=correct, finished_reason="stop" if fin else None)


def test_books_only_for_finished_rows_and_filtered_like_the_rows():
    a, b, c = _req("a", 9, 3, 5, True), _req("b", 7, 2, 3, False), _req("c", 4, 1, 1, True)
    # c reappears for one overlap step after it finished: SGLang did not count it (vct did not move)
    h = HostFacts(IdCache(), 7, "decode", "EAGLE", RankId(), True, (a, b, c), [6, 4, 4], [2, 1, 1],
                  [9, 7, 4], [3, 2, 1], [True, False, True], [3, 3, 1], 4)
    rec = h.record()
    assert rec.rids == ("a", "b")
    assert rec.books == ((3, 9, 5), (-1, -1, -1))
    h = HostFacts(IdCache(), 8, "decode", "EAGLE", RankId(), True, (b,), [4], [1], [7], [2], [False], [3], 4)
    assert h.record().books == ()


def test_a_request_finished_at_prefill_and_plain_decode():
    a = _req("a", 1, 0, 0, True)
    h = HostFacts(IdCache(), 1, "prefill", "EAGLE", RankId(), False, (a,), [0], None, [1], None, [True], None, 0)
    assert h.record().books == ((-1, 1, 0),)
    d = SimpleNamespace(rid="d", origin_input_ids=[1], output_ids=[0] * 5, finished_reason="stop")
    h = HostFacts(IdCache(), 2, "decode", "NONE", RankId(), False, (d,), [4], None, [5], None, [True], None, 0)
    assert h.record().books == ((-1, 5, -1),)
