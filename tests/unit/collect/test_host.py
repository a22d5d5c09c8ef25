"""``collect/host``: the record the drain thread builds from a step's host facts, checked by hand.

Each case states what the scheduler thread read (output lengths before and after, verify counts
before and after, finished flags, ``accept_lens``) and the record SGLang's own counting implies:
``ctx_len = prompt + output before``, ``committed = emitted - output before`` (never negative),
rows SGLang did not count left out, no record when it counted none; a prefill commits nothing but
a re-prefill's token.  ``IdCache`` reuses the ids while the batch's requests are the same objects.
"""

from __future__ import annotations

import pytest

from fakes import Req
from sglang_ctxprof.collect import adapter, host
from sglang_ctxprof.collect.host import HostFacts, IdCache
from sglang_ctxprof.collect.step import StepBuilder
from sglang_ctxprof.model.names import KIND_DECODE, KIND_PREFILL
from sglang_ctxprof.model.records import RankId

MS = 1_000_000


def facts(reqs, lens_pre, emitted, fin, *, kind=KIND_DECODE, spec=True, vct_pre=None, vct_post=None,
          accepts=None, ids=None) -> HostFacts:
    return HostFacts(ids or IdCache(), 7, kind, "EAGLE", RankId(), spec, tuple(reqs), list(lens_pre),
                     vct_pre, list(emitted), vct_post, list(fin), accepts, 4)


def two():
    return [Req("a", 100), Req("b", 700)]


def test_speculative_decode_record_by_hand():
    f = facts(two(), lens_pre=[1, 5], emitted=[4, 7], fin=[False, True], vct_pre=[0, 2], vct_post=[1, 3],
              accepts=[3, 2])
    assert f.counted()
    r = f.record()
    assert (r.rids, r.ctx_lens, r.accepted, r.committed, r.finished) == (
        ("a", "b"), (101, 705), (3, 2), (3, 2), (False, True))
    assert (r.step_id, r.kind, r.algorithm, r.draft_tokens) == (7, KIND_DECODE, "EAGLE", 4)


def test_a_row_sglang_did_not_count_is_left_out():
    """Overlap: a finished request reappears for one step; its verify count does not move."""
    f = facts(two(), lens_pre=[1, 9], emitted=[4, 9], fin=[False, True], vct_pre=[0, 4], vct_post=[1, 4],
              accepts=[3, 1])
    r = f.record()
    assert (r.rids, r.ctx_lens, r.accepted, r.committed, r.finished) == (("a",), (101,), (3,), (3,), (False,))


def test_no_counted_row_means_no_record():
    f = facts(two(), lens_pre=[9, 9], emitted=[9, 9], fin=[True, True], vct_pre=[4, 4], vct_post=[4, 4],
              accepts=[1, 1])
    assert not f.counted() and f.record() is None
    assert facts([], [], [], [], spec=False).record() is None


def test_plain_decode_accepts_one_and_skips_requests_done_before_the_step():
    f = facts(two(), lens_pre=[3, 8], emitted=[4, 8], fin=[False, True], spec=False)
    f.done_pre = [False, True]  # b had finished (or was retracted) before this step
    assert f.counted()
    r = f.record()
    assert (r.rids, r.accepted, r.committed) == (("a",), (1,), (1,))
    f.done_pre = [True, True]
    assert not f.counted()
    plain = facts(two(), lens_pre=[3, 8], emitted=[4, 9], fin=[False, False], spec=False)
    assert plain.counted() and plain.record().accepted == (1, 1)


@pytest.mark.parametrize("accepts,expected", [([], (0, 0)), ([2], (2, 0)), ([2.0, 3.0], (2, 3))])
def test_accept_lens_device_tensor_short_list_and_floats(accepts, expected):
    """A device tensor reads as [] (0: never synchronized for), a missing entry as 0, floats as ints."""
    f = facts(two(), lens_pre=[1, 1], emitted=[2, 2], fin=[False, False], vct_pre=[0, 0], vct_post=[1, 1],
              accepts=accepts)
    assert f.record().accepted == expected


def test_committed_is_never_negative():
    """Output shrank (a retraction between the reads): the step committed nothing, not a negative."""
    f = facts(two(), lens_pre=[6, 2], emitted=[1, 4], fin=[False, False], vct_pre=[0, 0], vct_post=[1, 1],
              accepts=[1, 3])
    assert f.record().committed == (0, 2)


def test_prefill_commits_only_a_reprefills_token():
    fresh = facts(two(), lens_pre=[0, 0], emitted=[1, 1], fin=[False, False], kind=KIND_PREFILL, spec=False)
    r = fresh.record()
    assert (r.ctx_lens, r.accepted, r.committed) == ((100, 700), (0, 0), (0, 0))
    again = facts(two(), lens_pre=[0, 12], emitted=[1, 13], fin=[False, False], kind=KIND_PREFILL, spec=False)
    assert again.record().committed == (0, 1)  # b was retracted with 12 tokens and prefilled again


def test_a_cpu_step_is_resolved_on_the_drain_thread():
    b = StepBuilder(KIND_DECODE, 0)
    b.span = (0, 10 * MS)
    b.marks = [("draft", 0, 2 * MS), ("verify", 2 * MS, 8 * MS)]
    f = facts(two(), lens_pre=[1, 1], emitted=[2, 2], fin=[False, False], vct_pre=[0, 0], vct_post=[1, 1],
              accepts=[1, 1])
    f.builder, f.full_phases = b, True
    r = f.record()
    assert r.step_ms == 10.0 and r.phases_ms["draft"] == 2.0 and r.phases_ms["overhead"] == 2.0
    assert f.builder is None  # resolved once


def test_id_cache_reuses_ids_while_the_batch_is_the_same_requests(monkeypatch):
    calls = []
    real = adapter.req_ids
    monkeypatch.setattr(host.adapter, "req_ids", lambda reqs: calls.append(reqs) or real(reqs))
    reqs = tuple(two())
    cache = IdCache()
    first = cache.get(reqs)
    assert first == (("a", "b"), (100, 700))
    assert cache.get(tuple(reqs)) is first and len(calls) == 1  # same objects, same order: no re-read
    swapped = cache.get(reqs[::-1])
    assert swapped == (("b", "a"), (700, 100)) and len(calls) == 1  # known requests: not read again
    assert cache.get((reqs[0], Req("a", 5))) == (("a", "a"), (100, 5))  # same rid, another request


def test_id_cache_reads_only_the_requests_it_has_not_seen(monkeypatch):
    """A batch whose membership changes by a few requests reads those few, not the whole batch."""
    calls = []
    real = adapter.req_ids
    monkeypatch.setattr(host.adapter, "req_ids", lambda reqs: calls.append(len(reqs)) or real(reqs))
    batch = [Req(f"r{i}", 10 + i) for i in range(64)]
    cache = IdCache()
    cache.get(tuple(batch))
    batch[5], batch[40] = Req("n1", 3), Req("n2", 4)  # two finished, two new ones took their places
    rids, plens = cache.get(tuple(batch))
    assert calls == [64, 2]
    assert rids == tuple(r.rid for r in batch) and plens == tuple(len(r.origin_input_ids) for r in batch)


def test_id_cache_forgets_requests_that_left():
    cache = IdCache()
    for k in range(3 * host.PRUNE):  # a batch of one, a new request each time
        r = Req(f"r{k}", k)
        assert cache.get((r,)) == ((f"r{k}",), (k,))
    assert len(cache._rid) <= 2 + host.PRUNE and len(cache._plen) == len(cache._rid)


def test_id_cache_reads_unhashable_requests_whole():
    class Unhashable(Req):
        __hash__ = None  # type: ignore[assignment]

    a, b = Unhashable("a", 3), Unhashable("b", 4)
    assert IdCache().get((a, b)) == (("a", "b"), (3, 4))


def test_a_prefill_skips_requests_done_before_it_and_marks_decode_rows_of_a_mixed_batch():
    """``--enable-mixed-chunk``: running requests decode inside a prefill batch.  Their rows append one
    token on top of earlier output (as a retracted request's re-prefill does), so they carry
    ``accepted`` 1 (a token decoded, not a re-prefill); a request that finished before the step
    (overlap: an abort, or one that finished at the last step) rides along and SGLang skips its row,
    as does ours; a prefill whose rows are all such has no record."""
    reqs = [Req("new", 64), Req("dec", 32), Req("gone", 32)]
    f = facts(reqs, lens_pre=[0, 9, 20], emitted=[1, 10, 20], fin=[False, False, True], kind=KIND_PREFILL,
              spec=False, accepts=[0, 1, 1])
    f.done_pre = [False, False, True]
    assert f.counted()
    r = f.record()
    assert (r.rids, r.ctx_lens, r.accepted, r.committed, r.finished) == (
        ("new", "dec"), (64, 41), (0, 1), (0, 1), (False, False))
    f.done_pre = [True, True, True]
    assert not f.counted() and f.record() is None


def test_mixed_decode_rows_are_the_batch_decoding_requests():
    class Batch:
        def __init__(self, reqs, decoding):
            self.reqs, self.decoding_reqs = reqs, decoding

    a, b, c = Req("a", 1), Req("b", 1), Req("c", 1)
    assert adapter.mixed_decode_rows(Batch([a, b, c], [c, a]), (a, b, c)) == [1, 0, 1]
    assert adapter.mixed_decode_rows(Batch([a, b], None), (a, b)) is None
    assert adapter.mixed_decode_rows(Batch([a, b], []), (a, b)) is None
