"""A step's facts as plain builtins, and the :class:`StepRecord` built from them (pure).

:class:`StepFacts` is what a step's record is built from once the request objects have been read
(``collect.host.HostFacts.facts``, in the scheduler's process): request ids and prompt lengths,
per request the output length and ``spec_verify_ct`` before and after the step, whether it
finished, ``accept_lens``, the engine's books of the requests that finished, and every other
:class:`StepRecord` field as it is.  It holds no SGLang object, so it pickles (the hand-off a drain
in another process needs) and :meth:`StepFacts.record` runs anywhere.

The record is exactly what reading every request on the scheduler thread gives: per request counted
by SGLang (speculative decode: ``spec_verify_ct`` moved; a row it skipped, e.g. a finished request
reappearing for one overlap step, is left out; non-speculative decode: a request that had finished
or been retracted before the step is left out, as SGLang skips it), ``ctx_len = prompt +
len(output_ids)`` before processing, ``accepted = accept_lens[i]`` (1 without speculative
decoding, 0 for a missing entry), ``committed = max(0, emitted after - len(output_ids) before)``,
and ``finished``.  A prefill row commits 0 tokens, except the re-prefill of a retracted request (it
already had output): the one token that prefill appends.

Imports nothing from SGLang, torch or OTel.
"""

from __future__ import annotations

from dataclasses import fields
from itertools import compress, repeat
from operator import add, eq, ne, sub
from typing import Optional, Union

from .names import KIND_DECODE
from .records import StepRecord

# Record fields computed from the per-request facts; every other StepRecord field is a StepFacts
# attribute of the same name, carried over as it is.
PER_REQUEST = ("rids", "ctx_lens", "accepted", "committed", "finished", "books", "prompt_lens")
CARRIED = tuple(f.name for f in fields(StepRecord) if f.name not in PER_REQUEST)
# Carried fields aligned with the rows when not empty (a prefill's): the rows left out take theirs along.
ALIGNED = ("trace_parents", "cached_lens", "retractions")
Books = tuple[tuple[int, int, int], ...]
# ctx, accepted, committed, finished
Columns = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[bool, ...]]


def reprefill_tokens(lens_pre: list, emitted: list) -> tuple[int, ...]:
    """A prefill row's committed tokens: the token a re-prefill appends to a request that already had
    output (SGLang retracted it under KV pressure and prefills prompt + output again), else 0.  The
    first prefill's token is the ``1`` of ``1 + committed == completion_tokens``, not counted here."""
    return tuple(max(0, e - p) if p else 0 for p, e in zip(lens_pre, emitted))


class StepFacts:
    """``rids`` and ``prompt_lens`` per request (the request objects resolved), the per-request
    lists the scheduler thread read, ``books`` of the finished requests ((-1, -1, -1) for the
    others; () when none finished), and the carried record fields.  The record is built in two
    stages (:meth:`build`): the per-request ``columns``, then the overshoot filter and the record."""

    __slots__ = ("rids", "prompt_lens", "spec", "lens_pre", "vct_pre", "emitted", "vct_post", "fin",
                 "accepts", "done_pre", "books", "columns") + CARRIED

    def __init__(self, rids: tuple[str, ...], prompt_lens: tuple[int, ...], spec: bool, lens_pre: list,
                 vct_pre: Optional[list], emitted: list, vct_post: Optional[list], fin: list,
                 accepts: Optional[list], done_pre: Optional[list], books: Books, **carried: object) -> None:
        self.rids = rids
        self.prompt_lens = prompt_lens
        self.spec = spec
        self.lens_pre = lens_pre
        self.vct_pre = vct_pre
        self.emitted = emitted
        self.vct_post = vct_post
        self.fin = fin
        self.accepts = accepts
        self.done_pre = done_pre
        self.books = books
        self.columns: Optional[Columns] = None  # built by the first stage
        for name in CARRIED:
            setattr(self, name, carried[name])

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        for n, v in zip(self.__slots__, state):
            setattr(self, n, v)

    def build(self) -> Union["StepFacts", StepRecord, None]:
        """One stage of :meth:`record` (the drain thread takes a step in pieces): the per-request
        columns first (this object comes back holding them), then the record, or None."""
        if self.columns is None:
            self.columns = self._columns()
            return self
        return self._record(self.columns)

    def record(self) -> Optional[StepRecord]:
        """The step's record, or None when SGLang counted no row of it."""
        return self._record(self.columns if self.columns is not None else self._columns())

    def _columns(self) -> Columns:
        """Context lengths, accepted and committed tokens, and finished, for every row read."""
        n = len(self.rids)
        ctx = tuple(map(add, self.prompt_lens, self.lens_pre))
        fin = tuple(self.fin)
        if self.kind != KIND_DECODE:  # accepts: the decode rows of a mixed batch (1), or None
            acc = (0,) * n
            com = reprefill_tokens(self.lens_pre, self.emitted) if any(self.lens_pre) else acc
            return ctx, tuple(self.accepts) if self.accepts else acc, com, fin
        al = self.accepts
        if al is None:
            acc = (1,) * n
        else:
            acc = tuple(al[:n]) if al and type(al[0]) is int else tuple(map(int, al[:n]))
            if len(acc) < n:
                acc += (0,) * (n - len(acc))
        com = tuple(map(sub, self.emitted, self.lens_pre))
        if com and min(com) < 0:
            com = tuple(map(max, repeat(0), com))
        return ctx, acc, com, fin

    def _record(self, columns: Columns) -> Optional[StepRecord]:
        """The record of the rows SGLang counted (decode: the overshoot filter), or None."""
        rids, books = self.rids, self.books
        prompts = tuple(self.prompt_lens) if self.kind != KIND_DECODE else ()
        ctx, acc, com, fin = columns
        post, pre = self.vct_post, self.vct_pre
        keep: Optional[list] = None
        spec = self.kind == KIND_DECODE and self.spec and post is not None and pre is not None
        if spec and any(map(eq, post, pre)):
            keep = list(map(ne, post, pre))  # rows SGLang counted (not overshoot)
        elif self.done_pre is not None:  # rows SGLang skipped (already finished or retracted)
            keep = [not d for d in self.done_pre]
        carried = {name: getattr(self, name) for name in CARRIED}
        if keep is not None:
            rids, ctx, acc, com, fin = (tuple(compress(x, keep)) for x in (rids, ctx, acc, com, fin))
            books = tuple(compress(books, keep)) if books else ()
            prompts = tuple(compress(prompts, keep)) if prompts else ()
            for name in ALIGNED:
                if carried[name]:
                    carried[name] = tuple(compress(carried[name], keep))
        if not rids:
            return None
        return StepRecord(rids=rids, ctx_lens=ctx, accepted=acc, committed=com, finished=fin,
                          books=books if True in fin else (), prompt_lens=prompts, **carried)
