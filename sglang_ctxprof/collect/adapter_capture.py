"""SGLang's own profiler, driven from inside the scheduler: the deep capture's only SGLang seam.

SGLang 0.5.23 keeps its torch profiler on ``Scheduler.profiler_manager``
(``managers/scheduler_components/profiler_manager.SchedulerProfilerManager``), fed by ``ProfileReq``
(``output_dir``, ``num_steps``, ``activities``...).  :func:`start` hands it a ``ProfileReq`` exactly as
``POST /start_profile`` does (no ``num_steps``: the capture counts its own steps and stops it);
:func:`stop` calls SGLang's own ``_stop_profile`` (its file naming, rank barrier, state reset), with
the profiler object wrapped so that its ``export_chrome_trace`` (the call that froze the scheduler
for seconds, sglang PR 35115) is handed to our export thread instead of running here.  The profiler
itself is stopped on the scheduler thread (torch requires the thread that started it).  A rank
whose stop does not reach SGLang's barrier (its start failed, or its stop failed before the
barrier) waits there all the same (:func:`stop_barrier`): the TP group's other ranks stop theirs there.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..model.names import KIND_PREFILL
from ..model.rids import short_rid
from .adapter import batch_kind

Export = Callable[[Any, str], None]  # (stopped torch profiler, path SGLang chose) -> None
NOTHING_EXPORTED = "SGLang's profiler exported nothing: another caller (POST /stop_profile) stopped it first"


class _DeferredExport:
    """Stands in for SGLang's ``torch_profiler`` during ``_stop_profile``: stops the real one here
    and passes its export to ``export`` (another thread).  Once the export is handed over it clears
    the manager's ``torch_profiler`` itself, which skips the ``gc.collect()`` SGLang runs at the end
    to free the profiler: our export thread still holds it then, so that collection could free
    nothing and would only stall the scheduler (hundreds of ms in a server's heap)."""

    def __init__(self, pm: Any, real: Any, export: Export) -> None:
        self.pm, self.real, self.export = pm, real, export
        self.path: Optional[str] = None
        self.stop_ms = 0.0
        self.stopped = False

    def stop(self) -> None:
        t0 = time.perf_counter()
        self.stopped = True
        self.real.stop()
        self.stop_ms = (time.perf_counter() - t0) * 1e3

    def export_chrome_trace(self, path: str) -> None:
        self.path = path
        self.export(self.real, path)
        self.pm.torch_profiler = None


def manager(scheduler: Any) -> Any:
    return getattr(scheduler, "profiler_manager", None)


def unavailable(scheduler: Any) -> Optional[str]:
    """Why SGLang's profiler cannot take a capture now, or None."""
    pm = manager(scheduler)
    if pm is None:
        return "this SGLang has no scheduler profiler_manager"
    try:
        from sglang.srt.environ import envs

        if envs.SGLANG_PROFILE_V2.get():
            return "SGLANG_PROFILE_V2 is set: its profile manager is not driven by ctxprof"
    except (ImportError, AttributeError):
        pass
    if getattr(pm, "profile_in_progress", False):
        return "SGLang's profiler is already running (a /start_profile capture)"
    return None


def start(scheduler: Any, output_dir: str, profile_id: str, gpu: bool) -> Optional[str]:
    """Start SGLang's profiler now (CPU, plus GPU activity on a GPU); an error message or None."""
    why = unavailable(scheduler)
    if why:
        return why
    from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType

    req = ProfileReq(req_type=ProfileReqType.START_PROFILE, output_dir=output_dir, num_steps=None,
                     activities=["CPU", "GPU"] if gpu else ["CPU"], with_stack=False, record_shapes=False,
                     profile_id=profile_id, profile_prefix="ctxprof")
    out = manager(scheduler)._profile(req)
    if out is None or not getattr(out, "success", False):
        return str(getattr(out, "message", "SGLang's profiler did not start"))
    return None


def stop(scheduler: Any, export: Export, profile_id: str) -> tuple[Optional[str], float]:
    """Stop SGLang's profiler through its own ``_stop_profile``, if it still runs the capture
    ``profile_id``; the export goes to ``export``.  Returns the trace path SGLang chose (None when
    nothing was exported: another caller, ``POST /stop_profile``, stopped it first, and what runs
    now, if anything, is theirs) and the ms torch's own ``stop()`` took (the rest of the scheduler
    thread's time is SGLang's stop bookkeeping)."""
    pm = manager(scheduler)
    real = getattr(pm, "torch_profiler", None)
    if real is None or getattr(pm, "profile_id", profile_id) != profile_id:
        return None, 0.0
    proxy = _DeferredExport(pm, real, export)
    pm.torch_profiler = proxy
    try:
        pm._stop_profile()
    finally:
        if pm.torch_profiler is proxy:  # _stop_profile failed before handing the export over
            pm.torch_profiler = None
            pm.profile_in_progress = False
            if not proxy.stopped:  # never leave torch's profiler recording
                real.stop()
            stop_barrier(scheduler)  # ... so before its barrier, where the other ranks wait
    return proxy.path, proxy.stop_ms


def stop_barrier(scheduler: Any) -> None:
    """Wait where SGLang's ``_stop_profile`` waits for every rank of the TP group (its CPU group's
    barrier), for a rank whose own stop did not get there (its capture never started, or its stop
    failed first): the other ranks stop theirs there.  Nothing to wait for on one rank."""
    if world_size(scheduler) <= 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier(manager(scheduler).dp_tp_cpu_group)


def forward_ct(scheduler: Any) -> int:
    return int(getattr(scheduler, "forward_ct", 0) or 0)


def batch_rids(batch: Any) -> tuple[str, ...]:
    """The batch's request ids as the profiler keeps them (``model.rids.short_rid``)."""
    return tuple(short_rid(getattr(r, "rid", "")) for r in (getattr(batch, "reqs", None) or ()))


def is_prefill(batch: Any) -> bool:
    """A prefill (extend) batch: SGLang runs one for new requests between two decode steps of the
    running ones, which it leaves out of that batch."""
    return batch_kind(batch) == KIND_PREFILL


def batch_ctx(batch: Any) -> int:
    return int(getattr(batch, "seq_lens_sum", 0) or 0)


def world_size(scheduler: Any) -> int:
    """Scheduler ranks that must agree on a capture (SGLang's stop barrier spans the TP group)."""
    sa = getattr(scheduler, "server_args", None)
    return int(getattr(sa, "tp_size", 1) or 1) * int(getattr(sa, "pp_size", 1) or 1)
