"""How SGLang ends a request outside its steps (part of the adapter: SGLang internals live here).

A request that ends in a step says so in that step's record (``finished``).  One that SGLang drops
while it waits in the scheduler's queue never reaches another step: aborted before its first
prefill (``POST /abort_request``, or its client hung up while it was queued), aborted after a
retraction put it back in the queue, aborted between chunks of its prefill, or rejected (queue full,
bad input).  Every one of those paths reports the request to the tokenizer through
``Scheduler.send_abort_output(abort_req, req)`` (0.5.23: ``abort_request``'s waiting-queue and
chunked-prefill branches, ``_abort_on_queued_limit``, the retraction of beam groups), and nothing
else calls it.  The hook (``hooks.request_end``) turns each call into a
:class:`~sglang_ctxprof.model.records.RequestEnd` for the drain thread.

``req.is_retracted`` stays True from the retraction until the request is prefilled again
(``ScheduleBatch.prepare_for_extend``), so it tells a retracted-then-aborted request apart.

A request that ended before a step can still ride it (the overlap scheduler launches the next batch
before it processes the last one's results): a finished or retracted request in the next decode, or
in the next prefill when it decoded in a mixed batch (``--enable-mixed-chunk``), or a prompt chunk
in flight when its request was aborted.  SGLang skips those rows (``done_rows`` tells them), and the
running requests that decode inside a mixed prefill batch are ``mixed_decode_rows``.
"""

from __future__ import annotations

import time
from itertools import repeat
from operator import attrgetter, is_not, or_
from typing import Any, Optional

from ..model.records import RequestEnd
from ..model.rids import short_rid
from .adapter_releases import _S

# (dotted path, hook kind): optional, so a release without it loads (aborted requests then stay
# unfinished in the history until evicted).
TARGETS: tuple[tuple[str, str], ...] = ((f"{_S}.send_abort_output", "request_end"),)

SIGNATURES: dict[str, tuple[str, ...]] = {f"{_S}.send_abort_output": ("self", "abort_req", "req")}


def ended_request(req: Any) -> RequestEnd:
    """The end of ``req`` as the history records it (the rid the profiler keeps, whether it was
    waiting to be prefilled again after a retraction, and now on the host clock of step records)."""
    return RequestEnd(short_rid(req.rid), getattr(req, "is_retracted", False) is True, time.time_ns(),
                      int(getattr(req, "retraction_count", 0) or 0))


def held_rids(scheduler: Any) -> Optional[frozenset[str]]:
    """The rids (as the history keeps them) of the requests SGLang still holds unfinished: its waiting
    queue, running batch, last batch and chunked request; read where profiling starts again (a request
    the history holds unfinished and SGLang does not ended while it was off).  None where SGLang holds
    requests elsewhere too (disaggregation, diffusion LLMs, pipeline stages) or they cannot be read."""
    try:
        mode = getattr(getattr(scheduler, "disaggregation_mode", None), "value", "null")
        if mode != "null" or getattr(scheduler, "dllm_config", None) is not None \
                or getattr(getattr(scheduler, "server_args", None), "pp_size", 1) != 1:
            return None
        reqs = [*scheduler.waiting_queue, *scheduler.running_batch.reqs,
                *(getattr(getattr(scheduler, "last_batch", None), "reqs", None) or ())]
        if getattr(scheduler, "chunked_req", None) is not None:
            reqs.append(scheduler.chunked_req)
        return frozenset(short_rid(r.rid) for r in reqs if not req_finished(r))
    except Exception:  # noqa: BLE001 - another layout: nothing is judged ended
        return None


FINISHED_REASON = attrgetter("finished_reason")
_RETRACTED = attrgetter("is_retracted")


def req_finished(req: Any) -> bool:
    try:
        return bool(req.finished())
    except Exception:  # noqa: BLE001
        return False


def done_rows(reqs: tuple) -> Optional[list[bool]]:
    """Finished or retracted, per request; None when none is (the common case: one list, no copy)."""
    try:
        done = list(map(is_not, map(FINISHED_REASON, reqs), repeat(None)))
        retracted = list(map(_RETRACTED, reqs))
    except AttributeError:
        done = [req_finished(r) for r in reqs]
        retracted = [bool(getattr(r, "is_retracted", False)) for r in reqs]
    if True in retracted:
        done = list(map(or_, done, retracted))
    return done if True in done else None


def mixed_decode_rows(batch: Any, reqs: tuple) -> Optional[list[int]]:
    """1 for each row of a mixed batch (``--enable-mixed-chunk``: running requests decode inside a
    prefill step, ``batch.decoding_reqs``) that is such a decode, 0 for the others; None for a batch
    with none (every other prefill)."""
    decoding = getattr(batch, "decoding_reqs", None)
    if not decoding:
        return None
    ids = set(map(id, decoding))
    return [1 if id(r) in ids else 0 for r in reqs]
