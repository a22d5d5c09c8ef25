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
