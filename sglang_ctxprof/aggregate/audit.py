"""The live self-audit: the engine's books and our own, checked on the drain thread for every record.

:class:`Audit` is fed each :class:`~sglang_ctxprof.model.records.StepRecord` by the aggregator,
after the request history has taken it, and counts each broken invariant
(``names.AUDIT_INVARIANTS``):

* ``leaf_sum``: a decode step's leaf phases (``records.leaf_phases``: a forward whose attention/MoE
  split was left out counts whole) add up to the step, within 1 us plus one part in 10^6;
* ``accepted_bound``: no request accepts more than the step's draft positions
  (``StepRecord.draft_positions``: the chain or block behind its anchor) plus its non-draft tokens
  (the bonus token; UNO's clean root as well);
* ``hook_once``: every hooked phase (draft, verify and its attention/MoE blocks, draft_extend, a plain
  decode's forward and its blocks) that timed the first decode step of an (algorithm, timing, draft
  tokens) triple times each later one: a hook that stops firing shows as its phase missing or at
  zero, a new one as a phase never seen before (adaptive speculation's depths apart: at 0 draft
  steps SGLang runs no draft);
* at a request's finish, against SGLang's own numbers carried by the record (``books``):
  ``verify_ct``: our decode steps == ``spec_verify_ct``; ``completion_tokens``:
  ``1 + committed == completion_tokens`` (no first token for a request that kept no output,
  ``max_new_tokens=0``: prompt scoring, and SGLang's own warm-up before an n>1 request);
  ``accept_metric``: our accepted drafts (``records.accepted_drafts`` of each of the request's
  steps, summed) == SGLang's ``spec_num_correct_drafts``, the count behind its ``spec_accept_rate``
  and ``spec_accept_length`` metrics.  A request the history does not hold whole (evicted, or
  (re)created after its prefill: ``RequestLog.tally``) is checked for none of them.

A record costs a few dict lookups and one sum over its leaf phases (its phase-name tuple is looked up
once); a finished request a few C-level sums over its kept rows.  ``status()`` lists the counts, what
was checked, and the latest violations.  Pure: imports only the package's record types.
"""

from __future__ import annotations

from collections import deque
from itertools import compress
from typing import Any, Iterator, Optional

from ..model.names import AUDIT_INVARIANTS, KIND_DECODE, Phase
from ..model.records import StepRecord, leaf_phases
from .requests import RequestLog

LATEST = 16  # violations listed in /ctx_profile/status
HOOKED: frozenset[str] = frozenset({Phase.DRAFT.value, Phase.VERIFY.value, Phase.VERIFY_ATTN.value,
                                    Phase.VERIFY_MOE.value, Phase.DRAFT_EXTEND.value, Phase.DECODE.value,
                                    Phase.DECODE_ATTN.value, Phase.DECODE_MOE.value})


def _shape(keys: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(phases that sum to the step, hooked phases) of a record whose phases are named ``keys``."""
    return leaf_phases(keys), tuple(k for k in keys if k in HOOKED)


class Audit:
    __slots__ = ("counts", "lifetime", "checked", "latest", "_shapes", "_expected")

    def __init__(self, latest: int = LATEST, lifetime: Optional[dict[str, int]] = None) -> None:
        self.counts: dict[str, int] = dict.fromkeys(AUDIT_INVARIANTS, 0)
        # the same counts, never reset: the owner's, handed to each audit after a reset (a counter's)
        self.lifetime = lifetime if lifetime is not None else dict.fromkeys(AUDIT_INVARIANTS, 0)
        self.checked = {"steps": 0, "requests": 0}
        self.latest: deque = deque(maxlen=latest)
        self._shapes: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # (algorithm, timing, draft tokens) -> the hooked phases of its first decode step
        self._expected: dict[tuple[str, str, int], tuple[str, ...]] = {}

    def _bad(self, inv: str, rec: StepRecord, rid: str, detail: str) -> None:
        self.counts[inv] += 1
        self.lifetime[inv] += 1
        self.latest.append({"invariant": inv, "step_id": rec.step_id, "rid": rid, "detail": detail,
                            "t_ns": rec.t_start_ns})

    def observe(self, rec: StepRecord, requests: Optional[RequestLog] = None) -> None:
        for _ in self.stages(rec, requests):
            pass

    def stages(self, rec: StepRecord, requests: Optional[RequestLog] = None) -> Iterator[None]:
        """``observe`` in pieces: the step's checks, then one piece per request that finished at it
        (its books sum its kept rows: thousands for a long request), a hand-over before each."""
        if rec.kind == KIND_DECODE and rec.rids:
            self.checked["steps"] += 1
            self._step(rec)
        if rec.books and requests is not None:
            yield from self._finished(rec, requests)

    def _step(self, rec: StepRecord) -> None:
        ph = rec.phases_ms
        get = ph.__getitem__
        keys = tuple(ph)
        shape = self._shapes.get(keys)
        if shape is None:
            shape = _shape(keys)
            if len(self._shapes) < 256:
                self._shapes[keys] = shape
        leaves, hooked = shape
        if leaves:
            total = sum(map(get, leaves))
            if abs(total - rec.step_ms) > 1e-3 + 1e-6 * rec.step_ms:
                self._bad("leaf_sum", rec, "", f"leaves sum to {total:.6f} ms, step {rec.step_ms:.6f} ms")
        top = max(rec.accepted)
        bound = rec.draft_positions + rec.non_draft_tokens
        if top > bound:
            i = rec.accepted.index(top)
            self._bad("accepted_bound", rec, rec.rids[i],
                      f"accepted {top} > {bound} (draft positions + non-draft tokens)")
        if hooked:
            key = (rec.algorithm, rec.timing, rec.draft_tokens)
            want = self._expected.get(key)
            if want is None or not (want == hooked and min(map(get, hooked)) > 0):
                self._hooks(rec, key, want, frozenset([k for k in hooked if get(k) > 0]))

    def _hooks(self, rec: StepRecord, key: tuple[str, str, int], want: Optional[tuple[str, ...]],
               fired: frozenset[str]) -> None:
        """The slow path: the first decode step of ``key`` sets the hooks expected; a later one differs."""
        if want is None:
            self._expected[key] = tuple(k for k in rec.phases_ms if k in fired)
        elif fired != frozenset(want):
            missing, extra = sorted(set(want) - fired), sorted(fired - set(want))
            self._bad("hook_once", rec, "", f"hooks missing {missing}, unexpected {extra}")

    def _finished(self, rec: StepRecord, requests: RequestLog) -> Iterator[None]:
        for rid, (vct, out, correct) in compress(zip(rec.rids, rec.books), rec.finished):
            if out < 0:
                continue  # no books read for it
            yield
            books = requests.tally(rid)
            if books is None:
                continue  # not held whole (evicted, or back without its prefill): nothing to check against
            steps, _, committed, ours = books  # what was folded plus its kept rows (C sums)
            self.checked["requests"] += 1
            first = 1 if out else 0  # a request that keeps no output (max_new_tokens=0) keeps no first token
            if first + committed != out:
                self._bad("completion_tokens", rec, rid, f"{first} + committed = {first + committed}, "
                                                         f"SGLang completion_tokens = {out}")
            if vct < 0:
                continue  # no speculative decoding (or a request that finished at its prefill)
            if steps != vct:
                self._bad("verify_ct", rec, rid, f"steps = {steps}, SGLang spec_verify_ct = {vct}")
            if correct >= 0 and ours != correct:
                self._bad("accept_metric", rec, rid, f"accepted drafts = {ours}, "
                                                     f"SGLang spec_num_correct_drafts = {correct}")

    def status(self) -> dict[str, Any]:
        """Counts per invariant since the profile was last reset (``violations``) and since the server
        started (``lifetime``: what a counter exports, never going down), how many steps and finished
        requests were checked, the latest violations."""
        return {"violations": dict(self.counts), "lifetime": dict(self.lifetime), "checked": dict(self.checked),
                "latest": list(self.latest)}
