"""The toy tree-drafting worker: SGLang's STANDALONE worker classes under our own names.

``ToyTreeDrafter.draft`` and ``._draft_extend_for_decode`` are this worker's own methods.  They run
SGLang's EAGLE draft code taken at import time (unwrapped if a profiler had already wrapped it),
standing in for a DDTree drafter's own code that no profiler knows.  With
``TOY_DDTREE_DECLARE_PHASES=1`` they declare their phases through ``sglang_ctxprof.phase``.
"""

from __future__ import annotations

import contextlib
import os

from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker, StandaloneWorkerV2

from . import DECLARE_ENV


def _own(fn):
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__ctxprof_wrapper__", False) else fn


_DRAFT = _own(EagleDraftWorker.__dict__["draft"])
_DRAFT_EXTEND = _own(EagleDraftWorker.__dict__["_draft_extend_for_decode"])
_DECLARE = os.environ.get(DECLARE_ENV) == "1"


def _phase(name: str):
    if not _DECLARE:
        return contextlib.nullcontext()
    import sglang_ctxprof

    return sglang_ctxprof.phase(name)


class ToyTreeDrafter(StandaloneDraftWorker):
    def draft(self, batch, *, with_topology: bool = False):
        with _phase("draft"):
            return _DRAFT(self, batch, with_topology=with_topology)

    def _draft_extend_for_decode(self, batch, batch_result, **kwargs):
        with _phase("draft_extend"):
            return _DRAFT_EXTEND(self, batch, batch_result, **kwargs)


class ToyDDTreeWorker(StandaloneWorkerV2):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        # Same state as the STANDALONE draft worker, our own methods (no second draft model load).
        self._draft_worker.__class__ = ToyTreeDrafter
