"""A step's host facts as the scheduler thread reads them, and the record the drain thread builds.

The scheduler thread pays only for what changes with the next step: per request, ``output_ids``
(its length before and after SGLang processes the result), ``spec_verify_ct`` before and after
(speculative decode), and whether it finished; per step, ``accept_lens`` as one list.  Each is one
C-level pass over the requests (``adapter.reqs_before`` / ``reqs_after``: ``map`` over attribute
getters); Python code runs per request only for those that finished (their ``finished_len``).  A
prefill step adds two C-level passes on that thread (``adapter.prefill_counts``): SGLang's running
totals of each request's prefix-cache hit and retractions, of which the drain counts each part once
(:meth:`Parts.new_part`); the clients' trace contexts, fixed once a
request exists, are read in the first stage below (each request says whether SGLang traces it,
which ``/set_trace_level`` can change between two requests).
Everything else happens on the recorder's drain thread, in four stages, each one piece of the
drain's work (:meth:`HostFacts.build`; at a batch of 256 they take 15-31 µs each at the median,
where the two stages they replaced took 36-46).  First the phase arithmetic of a CPU-clock step (``step.resolve``, plain integers) and
the request ids and prompt lengths (fixed while a request runs; :class:`IdCache` keeps them while
the batch's membership is unchanged, so an unchanged batch yields the very same ``rids`` tuple).
Then the books of the requests that finished (SGLang's own ``spec_verify_ct``,
``len(output_ids)`` and ``spec_num_correct_drafts``, read when their counters no longer move, which
the self-audit, ``aggregate.audit``, checks ours against) and the plain facts
(``model.facts.StepFacts``, which pickle: nothing of them refers to a request object).  Then
:meth:`~model.facts.StepFacts.build` (pure) builds context lengths and committed counts, and last
applies the overshoot filter and builds the :class:`StepRecord` itself.  :meth:`HostFacts.facts`
and :meth:`HostFacts.record` run the stages in one go.
"""

from __future__ import annotations

from itertools import compress, filterfalse, repeat
from typing import Iterable, Optional, Union
from weakref import WeakKeyDictionary

from ..model.facts import CARRIED, Books, StepFacts
from ..model.names import KIND_DECODE
from ..model.records import RankId, StepRecord
from . import adapter
from .clocks import CpuClock
from .step import StepBuilder, resolve


PRUNE = 256  # requests the id cache may keep beyond twice the current batch before it forgets the gone ones


class Parts:
    """What records counted so far of a running total SGLang keeps on each request (``new_part``): a
    plain dict for the requests of recent batches (``hot``, cheap per row), and a weak one (``cold``)
    for those the id cache's pruning let go of, held as long as SGLang holds them (a retracted
    request waits outside every batch, and keeps its part for its re-prefill)."""

    __slots__ = ("hot", "cold")

    def __init__(self) -> None:
        self.hot: dict = {}
        self.cold: WeakKeyDictionary = WeakKeyDictionary()

    def miss(self, req: object) -> int:
        return self.cold.pop(req, 0) if self.cold else 0

    def prune(self, keep: tuple) -> None:
        """Move the parts of the requests not in ``keep`` to the weak dict."""
        held = set(keep)
        for req in [r for r in self.hot if r not in held]:
            self.cold[req] = self.hot.pop(req)

    def new_part(self, reqs: tuple, totals: tuple[int, ...], skip: Optional[list] = None) -> tuple[int, ...]:
        """Each request's part of a running total SGLang keeps per request (``IdCache.cached``:
        ``req.cached_tokens``, the prefix-cache hit found at a prompt's first chunk, which its later
        chunks, a re-prefill and a mixed batch's decode row add none to; ``IdCache.retracted``:
        ``req.retraction_count``) that no earlier record of it counted: counted once, as SGLang's
        ``meta_info`` does.  A row SGLang skips (``skip``: it ended or was retracted before the
        step's result) counts nothing and leaves its part to the request's next row."""
        if skip is not None and True in skip:
            kept = [not s for s in skip]
            part = iter(self.new_part(tuple(compress(reqs, kept)), tuple(compress(totals, kept))))
            return tuple(next(part) if k else 0 for k in kept)
        try:
            if not any(totals):  # nothing counted on any of them yet (no retraction, no cache hit)
                return tuple(map(int, totals))
            hot, miss = self.hot, self.miss
            out = tuple(t - (hot[r] if r in hot else miss(r)) for r, t in zip(reqs, totals))
            hot.update(zip(reqs, totals))
        except TypeError:  # requests that cannot be keys, or totals that are no numbers: none counted
            return (0,) * len(totals)
        return tuple(map(max, repeat(0), out)) if out and min(out) < 0 else out

    def forget(self, req: object) -> None:
        self.hot.pop(req, None)
        self.cold.pop(req, None)


class IdCache:
    """``(rids, prompt lengths)`` of the last batch seen; reused while its requests are the same
    objects in the same order (a C-level identity comparison).  When the membership changes, only
    the requests not seen before are read (``adapter.req_ids``): each known request's rid and prompt
    length come from a dict keyed by the request object (identity), in two C-level passes, so a
    batch that gains or loses a few requests costs little more than an unchanged one.  A request is
    forgotten when the record of the step where it finished is built (``forget``; SGLang has let go
    of it, and a kept reference would keep its token lists alive); others that left (retracted,
    aborted) once the dicts hold ``2 * batch + PRUNE`` of them; the running totals' counted parts
    (``cached``, ``retracted``: :class:`Parts`) then move to weak dicts.  The drain thread, or a read
    catching up under the recorder's lock (one build at a time)."""

    __slots__ = ("reqs", "ids", "_rid", "_plen", "cached", "retracted")

    def __init__(self) -> None:
        self.reqs: tuple = ()
        self.ids: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())
        self._rid: dict = {}  # request object -> its rid (as the profiler keeps it)
        self._plen: dict = {}  # request object -> its prompt length
        self.cached, self.retracted = Parts(), Parts()  # of the prefix-cache hits, and the retractions

    def get(self, reqs: tuple) -> tuple[tuple[str, ...], tuple[int, ...]]:
        if reqs != self.reqs:
            self.ids = self._lookup(reqs)
            self.reqs = reqs
        return self.ids

    def _lookup(self, reqs: tuple) -> tuple[tuple[str, ...], tuple[int, ...]]:
        rid_of, plen_of = self._rid, self._plen
        try:
            new = list(filterfalse(rid_of.__contains__, reqs))
        except TypeError:  # requests that cannot be dict keys: read them all
            return adapter.req_ids(reqs)
        if new:
            new_rids, new_plens = adapter.req_ids(new)
            rid_of.update(zip(new, new_rids))
            plen_of.update(zip(new, new_plens))
        try:
            rids = tuple(map(rid_of.__getitem__, reqs))
            plens = tuple(map(plen_of.__getitem__, reqs))
        except KeyError:  # defensive: builds run one at a time (under the recorder's lock, a stopped
            return adapter.req_ids(reqs)  # drain thread stays stopped); read them all, never raise
        if len(rid_of) > 2 * len(reqs) + PRUNE:
            self._rid, self._plen = dict(zip(reqs, rids)), dict(zip(reqs, plens))
            self.cached.prune(reqs)
            self.retracted.prune(reqs)
        return rids, plens

    def forget(self, reqs: Iterable) -> None:
        """Drop finished requests: the dicts, and the last batch if it holds one (its ids stay)."""
        rid_of, plen_of = self._rid, self._plen
        for req in reqs:
            try:
                rid_of.pop(req, None)
                plen_of.pop(req, None)
                self.cached.forget(req)
                self.retracted.forget(req)
            except TypeError:  # an unhashable request was never a key
                pass
            if req in self.reqs:
                self.reqs = ()  # the next batch is looked up again (its known requests from the dicts)


class HostFacts:
    __slots__ = ("ids", "spec", "reqs", "lens_pre", "vct_pre", "emitted", "vct_post", "fin", "accepts",
                 "builder", "full_phases", "done_pre", "read") + CARRIED

    def __init__(self, ids: IdCache, step_id: int, kind: str, algorithm: str, rank: Optional[RankId], spec: bool,
                 reqs: tuple, lens_pre: list, vct_pre: Optional[list], emitted: list,
                 vct_post: Optional[list], fin: list, accepts: Optional[list], draft_tokens: int) -> None:
        self.ids = ids
        self.step_id = step_id
        self.kind = kind
        self.algorithm = algorithm
        self.rank = rank
        self.spec = spec
        self.reqs = reqs
        self.lens_pre = lens_pre
        self.vct_pre = vct_pre
        self.emitted = emitted
        self.vct_post = vct_post
        self.fin = fin
        self.accepts = accepts
        self.draft_tokens = draft_tokens
        self.trace_parents: tuple[str, ...] = ()  # a prefill's: read in the build (``_read``)
        self.step_ms = 0.0
        self.phases_ms: dict[str, float] = {}
        self.t_start_ns = 0
        self.timing = ""
        self.builder: Optional[StepBuilder] = None  # a CPU-clock step's builder, resolved here instead of on the hot path
        self.full_phases = False
        self.non_draft_tokens = 1  # block drafters: set from the result (records.StepRecord)
        self.block_size = 0
        self.denoise_steps = 0
        self.t_end_ns = 0  # host clock when run_batch returned
        self.exec_mode = self.exec_reason = self.attn_backend = ""  # decode: adapter.exec_mode
        self.draft_depth = 0
        self.cached_lens: tuple[int, ...] = ()  # prefill: prompt tokens found in the prefix cache
        self.retractions: tuple[int, ...] = ()  # prefill: SGLang's retraction counts
        self.done_pre: Optional[list] = None  # finished/retracted before the step (not spec decode)
        self.read: Optional[tuple[tuple[str, ...], tuple[int, ...]]] = None  # rids, prompt lengths (build)

    def counted(self) -> bool:
        """Whether SGLang counted any row of this step (else there is no record)."""
        if self.spec:
            return self.vct_post != self.vct_pre
        if self.done_pre is not None:
            return False in self.done_pre
        return bool(self.reqs)

    def build(self) -> Union["HostFacts", StepFacts]:
        """One stage of :meth:`facts` (the drain thread takes a step in pieces): a CPU-clock step's
        phase arithmetic and the request ids first (this object comes back holding them), then the
        books and the plain facts."""
        if self.read is None:
            self._read()
            return self
        return self._facts(self.read)

    def facts(self) -> StepFacts:
        """The step's plain facts (drain thread): a CPU-clock step's phase arithmetic, the request ids
        and prompt lengths (``IdCache``), and the books of the requests that finished (then forgotten
        by the cache); nothing of it refers to a request object."""
        if self.read is None:
            self._read()
        return self._facts(self.read)

    def record(self) -> Optional[StepRecord]:
        """The step's record (drain thread), or None when no row was counted."""
        return self.facts().record()

    def _read(self) -> None:
        if self.builder is not None:
            res = resolve(self.builder, CpuClock, self.full_phases)  # None only without a span
            if res is not None:
                self.step_ms, self.phases_ms = res
            self.builder = None
        if self.kind != KIND_DECODE:  # a prefill's trace contexts, fixed once a request exists: read here
            tps = tuple(map(adapter.req_trace_parent, self.reqs))
            self.trace_parents = tps if any(tps) else ()
        self.read = self.ids.get(self.reqs)
        if self.cached_lens:
            self.cached_lens = self.ids.cached.new_part(self.reqs, self.cached_lens, self.done_pre)
        if self.retractions:
            self.retractions = self.ids.retracted.new_part(self.reqs, self.retractions, self.done_pre)

    def _facts(self, read: tuple[tuple[str, ...], tuple[int, ...]]) -> StepFacts:
        books: Books = ()
        if True in self.fin:
            books = self._books()
            self.ids.forget(compress(self.reqs, self.fin))
        return StepFacts(read[0], read[1], self.spec, self.lens_pre, self.vct_pre, self.emitted, self.vct_post,
                         self.fin, self.accepts, self.done_pre, books,
                         **{name: getattr(self, name) for name in CARRIED})

    def _books(self) -> Books:
        """The engine's own counts of each request that finished at this step (records.StepRecord.books);
        (-1, -1, -1) for the others, so the work grows with the finished requests, not the batch."""
        vct, emitted, reqs = self.vct_post, self.emitted, self.reqs
        books = [(-1, -1, -1)] * len(self.fin)
        for i in compress(range(len(books)), self.fin):
            books[i] = (vct[i] if vct is not None else -1, emitted[i], adapter.correct_drafts(reqs[i]))
        return tuple(books)
