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
"""

from __future__ import annotations

import time
from typing import Any

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
    return RequestEnd(short_rid(req.rid), getattr(req, "is_retracted", False) is True, time.time_ns())
