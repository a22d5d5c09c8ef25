"""``collect/host.IdCache`` keeps no finished request alive: once the record of the step where a
request finished is built, the cache holds no reference to SGLang's request object (whose token lists
would otherwise stay in memory until the cache's size bound forgets it)."""

from __future__ import annotations

import gc
import weakref

from fakes import Req
from sglang_ctxprof.collect.host import HostFacts, IdCache
from sglang_ctxprof.model.records import RankId


def _record(ids: IdCache, reqs: list, fin: list) -> None:
    n = len(reqs)
    h = HostFacts(ids, 7, "decode", "EAGLE", RankId(), True, tuple(reqs), [1] * n, [0] * n, [2] * n,
                  [1] * n, list(fin), [1] * n, 4)
    assert h.record() is not None


def test_a_finished_request_is_not_kept_alive_by_the_id_cache():
    ids = IdCache()
    live = [Req(f"r{i}", 10 + i) for i in range(8)]
    _record(ids, live, [False] * 8)
    done = live[3]
    gone = weakref.ref(done)
    _record(ids, live, [i == 3 for i in range(8)])  # r3 finishes at this step
    del live[3], done
    _record(ids, live, [False] * 7)  # the next step: r3 is no longer in the batch
    gc.collect()
    assert gone() is None, [type(o).__name__ for o in gc.get_referrers(gone())]


def test_a_finished_request_seen_again_for_one_overlap_step_is_forgotten_again():
    ids = IdCache()
    a, b = Req("a", 3), Req("b", 4)
    _record(ids, [a, b], [True, False])
    _record(ids, [a, b], [True, False])  # SGLang's overlap: the finished one appears once more
    gone = weakref.ref(a)
    del a
    _record(ids, [b], [False])
    gc.collect()
    assert gone() is None
    assert ids.get((b,)) == (("b",), (4,))


def _prefill(ids: IdCache, reqs: list, cached: tuple, fin=None) -> tuple:
    n = len(reqs)
    h = HostFacts(ids, 7, "prefill", "EAGLE", RankId(), False, tuple(reqs), [0] * n, None, [0] * n,
                  None, list(fin or [False] * n), None, 0)
    h.cached_lens = cached
    return h.record().cached_lens


def test_a_prefix_cache_hit_counts_once_over_a_prompts_chunks():
    """SGLang's ``cached_tokens`` is a running total, found at a prompt's first chunk: the later
    chunks, and a decode row riding a mixed batch, count none of it again; a new request its own."""
    ids = IdCache()
    a, b = Req("a", 300), Req("b", 50)
    assert _prefill(ids, [a], (96,)) == (96,)  # its first chunk found 96 cached
    assert _prefill(ids, [a], (96,)) == (0,)  # its next chunk
    assert _prefill(ids, [a, b], (96, 32)) == (0, 32)  # a decoding beside b's prompt
    assert _prefill(ids, [b], (32,), fin=[True]) == (0,)
    assert _prefill(ids, [Req("b", 50)], (32,)) == (32,)  # a new request under the same rid


def test_a_retraction_that_hit_a_prefill_in_flight_counts_at_the_prefill_that_follows():
    """Under overlap SGLang may retract a request whose prefill is still in flight: it skips that
    row (``done_pre``) and prefills the request again with no output, so no token says it was
    retracted.  Its ``retraction_count`` does: the retraction counts once, at the row kept."""
    ids = IdCache()
    a, b = Req("a", 100), Req("b", 50)

    def prefill(reqs, counts, skip=None):
        n = len(reqs)
        h = HostFacts(ids, 7, "prefill", "EAGLE", RankId(), False, tuple(reqs), [0] * n, None, [0] * n,
                      None, [False] * n, None, 0)
        h.retractions, h.done_pre = counts, skip
        return h.record()

    first = prefill([a, b], (1, 0), skip=[True, False])  # a retracted before its result: skipped
    assert first.rids == ("b",) and first.retractions == (0,)
    again = prefill([a], (1,))
    assert again.retractions == (1,)
    assert prefill([a], (1,)).retractions == (0,)  # its next chunk


def test_the_counted_parts_survive_the_id_caches_pruning():
    """A small prefill batch beside hundreds of running requests prunes the id cache's ids; the parts
    of SGLang's running totals already counted stay (held weakly): a request retracted and prefilled
    again counts only its new retraction, and no cache hit again."""
    ids = IdCache()
    running = [Req(f"r{i}", 100) for i in range(300)]

    def prefill(reqs, cached, retr):
        n = len(reqs)
        h = HostFacts(ids, 7, "prefill", "NONE", RankId(), False, tuple(reqs), [0] * n, None, [0] * n,
                      None, [False] * n, None, 0)
        h.cached_lens, h.retractions = tuple(cached), tuple(retr)
        return h.record()

    prefill(running, [64] * 300, [0] * 300)
    x = running[0]
    assert prefill([x], [64], [1]).retractions == (1,)
    ids.get(tuple(running))
    prefill([Req("new", 10)], [0], [0])  # prunes the ids
    again = prefill([x], [64], [2])
    assert again.cached_lens == (0,) and again.retractions == (1,)


def test_the_counted_parts_keep_no_request_alive():
    """A request that leaves without finishing (aborted while it waited) after the id cache's
    pruning moved its counted part to the weak dict: SGLang letting go of it is enough."""
    ids = IdCache()
    gone = Req("aborted", 10)
    ref = weakref.ref(gone)
    _prefill(ids, [gone], (64,))
    ids.get(tuple(Req(f"r{i}", 10) for i in range(300)))
    ids.get((Req("small", 10),))  # a small batch after many: prunes, its part moves to the weak dict
    assert gone in ids.cached.cold
    del gone
    gc.collect()
    assert ref() is None and len(ids.cached.cold) == 0
