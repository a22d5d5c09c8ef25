"""Deep capture: SGLang's own profiler for N steps, started from inside the scheduler, on a budget.

A trigger asks for a capture with :meth:`Capture.request`: the admin route (``manual``: the next N
steps; ``rid``: that request's next N steps, passing over the prefills of other requests that SGLang
runs between two of them) through the control channel, or the automatic triggers on the recorder's
drain thread (``collect.capture_triggers``: a slow step for its context, a host gap, a slow request).

The budget, enforced here and reported in ``/ctx_profile/status`` (``capture``):

* one capture at a time, at most one per ``interval_s`` (a trigger inside it is suppressed and
  counted by trigger: ``suppressed``), at most ``max_steps`` steps;
* a capture not started within its ``wait_s`` (by the HTTP process's clock, judged at the next control
  request: every rank alike) fails, and so does one cancelled before it starts (:meth:`Capture.cancel`;
  a running one stops there, its steps so far kept); one an admin asked for that ends without having
  started (so, or its start failed on the one rank) gives back the cooling-off it took;
* a byte cap on the kept files in ``dir``: after each export a capture that alone exceeds it is
  deleted and failed (the older ones stay), then the oldest go until the rest fit (outside the lock);
* the trace export runs on a thread of its own (``adapter_capture.stop``; ``export_gap_ms``: the
  longest step-to-step interval meanwhile); the scheduler thread only stops the profiler.

The scheduler thread drives the state machine in :meth:`tick` (from the ``run_batch`` hook on every
rank alike, only while ``armed``): pending -> running (SGLang's profiler started; our phases open as
``record_function`` ranges through ``hooks.label_phases``) -> exporting -> done | failed | deleted.
Decisions that ranks must share depend only on what every rank sees in the same loop iteration
(the control request, the batch, the step count, and the HTTP process's clock sent with the
request), so ranks never disagree; the automatic triggers run on one-rank groups only.  A capture
that fails to start on one rank of several (a cause of its own: its disk, its GPU's profiler)
follows the others' steps all the same and waits at SGLang's stop barrier with them, then fails.

Clocks: the trace's are ``baseTimeNanoseconds + ts`` (torch's), ours ``time.time_ns()``; a
``ctxprof.clock_sync`` range, opened right after the profiler starts between two wall-clock reads
(``sync_ns``), is what ``views.timeline`` aligns them on (their spread: the error).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter, deque
from typing import Any, Optional

from ..model import names
from ..model.config import CaptureSettings
from ..model.guard import Guard
from ..model.sinks import BindFacts
from . import adapter_capture, hooks
from .capture_books import CaptureInfo, KeptFiles
from .capture_triggers import AutoTriggers

logger = logging.getLogger(__name__)

HISTORY = 32  # captures remembered (status, links)
MAX_RIDS = 256  # request ids remembered per capture
RID_WAIT_STEPS = 4096  # a rid capture that never sees its request within this many steps fails
AUTO_RID_WAIT_STEPS = 16  # ... an automatic one (its request was running): it finished meanwhile
BUSY_RETRY_S = 1.0  # the least retry_after_s while a capture is pending, running or exporting
RID_PASS_STEPS = 16  # other requests' prefills in a row a running rid capture passes over before it stops


def most_ticks(info: CaptureInfo) -> int:
    """The most steps a capture runs: each of its steps after at most ``RID_PASS_STEPS`` passed over,
    and the one that stops it."""
    return info.steps * (RID_PASS_STEPS + 1) + 1


class Capture:
    def __init__(self, cfg: CaptureSettings, guard: Optional[Guard] = None) -> None:
        self.cfg = cfg
        self.triggers = AutoTriggers(cfg)  # their sink feeds them on the drain thread (``capture_triggers``)
        self.guard = guard
        self.armed = False  # the hot path's one check: a capture is pending, running or exporting
        self._lock = threading.RLock()  # current, exporting, armed, history (and the cap's books): any thread
        self.current: Optional[CaptureInfo] = None  # pending or running
        self.exporting: Optional[CaptureInfo] = None
        self.history: deque[CaptureInfo] = deque(maxlen=HISTORY)
        self.fired: Counter = Counter()
        self.suppressed: Counter = Counter()
        self.last_s: Optional[float] = None  # when the last accepted capture was requested
        self.label = ""  # "step=<id> ctx=<tokens>" of the step being captured
        self.files = KeptFiles(cfg.max_mb)  # the byte cap's books
        self.gpu = False
        self.ranks = 1  # the ranks that must agree on a capture (SGLang's stop barrier), from bind on
        self._seq = self._last_tick_ns = 0  # captures asked for; when the last tick ran

    def bind(self, scheduler: Any, facts: BindFacts = BindFacts()) -> None:
        """Device and ranks, at the first step: GPU activity on a GPU; automatic triggers only where one
        rank decides (SGLang's stop barrier spans the TP group); ``facts``: the slow-request policy."""
        self.gpu = "cuda" in str(getattr(getattr(scheduler, "server_args", None), "device", "") or "")
        self.ranks = adapter_capture.world_size(scheduler)
        self.triggers.bind(facts, self.ranks)

    # ---- triggers (any thread) -----------------------------------------------------------------------
    def request(self, trigger: str, steps: Optional[int] = None, rid: Optional[str] = None,
                now_s: Optional[float] = None, reason: str = "", trigger_step: Optional[int] = None,
                wait_s: Optional[float] = None) -> dict[str, Any]:
        """Ask for a capture.  Refused (and counted as suppressed) while one is pending, running or
        (on one rank alone) exporting, or inside the cooling-off interval.  Bad ``steps`` or
        ``wait_s`` raise ValueError.  With several ranks an export still running does not refuse:
        when it ends is each rank's own (its export thread), and ranks must accept or refuse alike."""
        n = self.cfg.steps if steps is None else int(steps)
        if not 1 <= n <= self.cfg.max_steps:
            raise ValueError(f"steps must be between 1 and {self.cfg.max_steps}, got {n}")
        wait = names.CAPTURE_WAIT_S if wait_s is None else float(wait_s)
        if not 0 < wait <= names.CAPTURE_MAX_WAIT_S:  # NaN too
            raise ValueError(f"wait_s must be above 0 and at most {names.CAPTURE_MAX_WAIT_S:g}, got {wait_s}")
        now = time.time() if now_s is None else float(now_s)
        with self._lock:
            why, busy = "", self.current or (self.exporting if self.ranks == 1 else None)
            if busy is not None:
                why = f"one capture at a time: {busy.id} is {busy.state}"
            elif self.last_s is not None and now - self.last_s < self.cfg.interval_s:
                why = f"cooling off: one capture per {self.cfg.interval_s:g} s"
            if why:
                self.suppressed[trigger] += 1
                left = self.cfg.interval_s - (now - self.last_s) if self.last_s is not None else 0.0
                retry = max(left, BUSY_RETRY_S if busy is not None else 0.0)  # when it ends is not known
                return {"accepted": False, "reason": why, "retry_after_s": round(retry, 3),
                        "suppressed": dict(self.suppressed)}
            self._seq += 1
            info = CaptureInfo(id=f"{self._seq}-{trigger}-{int(now)}", trigger=trigger, steps=n, rid=rid,
                               reason=reason, requested_ns=int(now * 1e9), trigger_step=trigger_step, wait_s=wait)
            info._before_s, self.current, self.last_s = self.last_s, info, now
            self.fired[trigger] += 1
            self.files.listed(self.history, info)
            self.armed = True
            return {"accepted": True, "capture": info.to_dict()}

    # ---- the state machine (scheduler thread) -------------------------------------------------------
    def tick(self, scheduler: Any, batch: Any) -> None:
        """At the start of every ``run_batch`` while armed.  A failure never fails the step, and
        leaves the rest of the profiler running: on one rank a pending capture ends failed, a running
        one is stopped now.  With several ranks (SGLang's stop barrier spans them) the rank follows
        the others' steps: a pending capture is taken as started by the others at that step (on a
        real step they do, but not on an idle batch, nor on one without a rid capture's request) and
        followed unstarted to the barrier; a running one counts the failed step, or stops where the
        others stop, by the count of steps (a failure on a prefill a rid capture passes over, or on a
        step where its request left, still parts them: each needs the batch this rank failed to
        read).  A running capture stops after :func:`most_ticks` steps whatever happens, on every
        rank alike: SGLang's profiler is never left recording."""
        try:
            info = self.current
            if info is not None and info.state == names.CAPTURE_RUNNING:
                info._ticks += 1
                if info._ticks >= most_ticks(info):
                    info.error = info.error or f"stopped after {info._ticks - 1} steps: its steps were not counted"
                    return self._stop(scheduler, info)
            self._tick(scheduler, batch)
        except Exception as exc:  # noqa: BLE001
            hooks.label_phases(None)
            info, why = self.current, f"{type(exc).__name__}: {exc}"
            if info is None:
                return
            if info.state != names.CAPTURE_RUNNING and self.ranks == 1:
                self._unstarted_end(info, why)
                return
            info.error = info.error or why
            try:
                step = adapter_capture.forward_ct(scheduler) + 1
                if info.state != names.CAPTURE_RUNNING:  # the others start theirs at this step (a
                    info.state, info.start_ns, info._unstarted = names.CAPTURE_RUNNING, time.time_ns(), True
                    info.step_ids.append(step)  # real one): follow their steps to the stop barrier
                elif info.step_ids[-1:] == [step]:  # failed after counting this step: the others
                    if self.ranks == 1:              # run it and stop at the next tick, if at all
                        info.step_ids.pop()  # one rank stops now: that step's forward is not in it
                        self._stop(scheduler, info)
                elif self.ranks == 1 or len(info.step_ids) >= info.steps:
                    self._stop(scheduler, info)  # one rank: now; several: the step the others stop at
                else:
                    info.step_ids.append(step)  # counted as the others count it
                    info._passed = 0
            except Exception as again:  # noqa: BLE001 - never into SGLang's step
                self._end(info, names.CAPTURE_FAILED, f"{why}; then {type(again).__name__}: {again}")

    def halt(self, scheduler: Any) -> None:
        """Profiling is being turned off (scheduler thread): stop a running capture, drop a pending one."""
        info = self.current
        if info is not None and info.state == names.CAPTURE_RUNNING:
            self._stop(scheduler, info)
        elif info is not None:
            self._unstarted_end(info, "profiling was disabled before the capture started")

    def _tick(self, scheduler: Any, batch: Any) -> None:
        t = time.time_ns()
        exp = self.exporting
        if exp is not None and self._last_tick_ns:
            exp.export_gap_ms = max(exp.export_gap_ms, (t - self._last_tick_ns) / 1e6)
            exp.export_steps += 1
        self._last_tick_ns = t
        info = self.current
        if info is None:
            with self._lock:  # a trigger may have asked for one since ``current`` was read
                self._rearm()
            return
        rids = adapter_capture.batch_rids(batch)
        if info.state == names.CAPTURE_RUNNING:
            if info.rid and info.rid not in rids and len(info.step_ids) < info.steps \
                    and info._passed < RID_PASS_STEPS and adapter_capture.is_prefill(batch):
                info._passed += 1  # another request's prefill between two of this one's steps
                hooks.label_phases(None)  # not one of its steps: no range of ours in the trace
                self.label = ""
                return
            if len(info.step_ids) >= info.steps or (info.rid and info.rid not in rids):
                self._stop(scheduler, info)  # done, or its request left (finished, retracted, aborted)
                return
            if info._passed:
                info._passed = 0
                hooks.label_phases(None if info._unstarted else self)
        elif info.rid and info.rid not in rids:
            info._waited += 1
            wait = RID_WAIT_STEPS if info.trigger == names.TRIGGER_RID else AUTO_RID_WAIT_STEPS
            if info._waited > wait:
                self._unstarted_end(info, f"request {info.rid} not seen in {wait} steps")
            return
        elif not rids:
            return  # an idle batch: start on a real step
        elif not self._start(scheduler, info):
            return
        info.step_ids.append(adapter_capture.forward_ct(scheduler) + 1)
        for r in rids:
            if len(info.rids) >= MAX_RIDS:
                break
            if r not in info.rids:
                info.rids.append(r)
        self.label = f"step={info.step_ids[-1]} ctx={adapter_capture.batch_ctx(batch)}"

    def idle(self, scheduler: Any, now_s: Optional[float] = None) -> None:
        """A control request arrived (scheduler thread), sent at ``now_s`` by the HTTP process's clock:
        stop a running capture no step has fed nor passed over since the previous control request (the
        server went idle mid-capture); fail a pending one asked for more than its ``wait_s`` before."""
        info = self.current
        if info is not None and info.state == names.CAPTURE_RUNNING:
            if info._fed == info._ticks:  # every step counts, a prefill passed over too
                self._stop(scheduler, info)
            else:
                info._fed = info._ticks
        elif info is not None and now_s is not None and now_s - info.requested_ns / 1e9 > info.wait_s:
            why = f"request {info.rid} not seen" if info.rid else "no step ran"
            self._unstarted_end(info, f"not started in {info.wait_s:g} s: {why}")

    def cancel(self, scheduler: Any, cid: Optional[str] = None) -> dict[str, Any]:
        """End the pending or running capture (``cid``: only that one) at a control request (scheduler
        thread, every rank alike): a pending one fails, a running one stops here and exports the steps
        it has.  ``cancelled``: its record, or None with the ``reason``."""
        info = self.current
        if info is None or (cid is not None and info.id != cid):
            other = self.find(cid) if cid is not None else None
            why = ("no capture is pending or running" if cid is None else
                   f"capture {cid} is {other.state}" if other is not None else f"capture {cid} not found")
            return {"cancelled": None, "reason": why}
        info.cancelled = True
        if info.state == names.CAPTURE_RUNNING:
            self._stop(scheduler, info)
        else:
            self._unstarted_end(info, "cancelled before it started")
        return {"cancelled": info.to_dict()}

    def _start(self, scheduler: Any, info: CaptureInfo) -> bool:
        try:
            os.makedirs(self.cfg.dir, exist_ok=True)
            why = adapter_capture.start(scheduler, self.cfg.dir, info.id, self.gpu)
        except Exception as exc:  # noqa: BLE001 - a capture failure never fails a step
            why = f"{type(exc).__name__}: {exc}"
        info.state, info.start_ns = names.CAPTURE_RUNNING, time.time_ns()
        if why and self.ranks > 1:  # the other ranks' stop waits for this
            info.error, info._unstarted = why, True  # one: follow their steps to it, then fail
            return True
        if why:
            self._unstarted_end(info, why)
            return False
        import torch

        a = time.time_ns()
        with torch.profiler.record_function(names.RANGE_CLOCK_SYNC):
            pass
        info.sync_ns = (a, time.time_ns())
        hooks.label_phases(self)
        return True

    def _stop(self, scheduler: Any, info: CaptureInfo) -> None:
        hooks.label_phases(None)
        self.label = ""
        info.end_ns = t0 = time.time_ns()
        self.exporting, self.current = info, None
        info.state = names.CAPTURE_EXPORTING
        try:
            if info._unstarted:  # wait where the other ranks stop theirs
                path = adapter_capture.stop_barrier(scheduler)
            else:
                path, info.profiler_stop_ms = adapter_capture.stop(
                    scheduler, lambda prof, p: self._export_async(info, prof, p), info.id)
        except Exception as exc:  # noqa: BLE001
            path, info.error = None, f"{type(exc).__name__}: {exc}"
        info.stop_ms = (time.time_ns() - t0) / 1e6
        if path is None:
            self.exporting = None
            self._end(info, names.CAPTURE_FAILED, info.error or adapter_capture.NOTHING_EXPORTED)

    def _unstarted_end(self, info: CaptureInfo, why: str) -> None:
        """Fail a capture that never started; one an admin asked for gives back the cooling-off its
        request took (an automatic one keeps it: a trigger firing again and again would fill the
        history with failures)."""
        with self._lock:
            if self.current is info and info.trigger in (names.TRIGGER_MANUAL, names.TRIGGER_RID):
                self.last_s = info._before_s
            self._end(info, names.CAPTURE_FAILED, why)

    def _rearm(self) -> None:
        """``armed`` from what is pending, running or exporting (caller holds the lock)."""
        self.armed = self.current is not None or self.exporting is not None

    def _end(self, info: CaptureInfo, state: str, error: str = "") -> None:
        """End ``info`` (scheduler or export thread) under the lock: a capture asked for meanwhile stays armed."""
        with self._lock:
            info.state, info.error = state, error or info.error
            self.current = None if self.current is info else self.current
            self.exporting = None if self.exporting is info else self.exporting
            self._rearm()
        if error:
            logger.warning("sglang-ctxprof: capture %s %s: %s", info.id, state, error)

    # ---- export (its own thread) ---------------------------------------------------------------------
    def _export_async(self, info: CaptureInfo, prof: Any, path: str) -> None:
        info.path = path
        threading.Thread(target=self._export, args=(info, prof, path), name="ctxprof-capture-export",
                         daemon=True).start()

    def _export(self, info: CaptureInfo, prof: Any, path: str) -> None:
        t0 = time.perf_counter()
        try:
            prof.export_chrome_trace(path)
            info.bytes = os.path.getsize(path)
        except Exception as exc:  # noqa: BLE001
            with contextlib.suppress(OSError):  # a part written: no reader opens it, no byte cap counts it
                os.remove(path)
            self._end(info, names.CAPTURE_FAILED, f"export failed: {type(exc).__name__}: {exc}")
            return
        finally:
            info.export_ms = (time.perf_counter() - t0) * 1e3
        with self._lock:  # the scheduler thread takes it at every step meanwhile: no file work under it
            files, older = KeptFiles.kept(self.history), list(self.files.older)
        on_disk = [c for c in files if os.path.exists(c.path or "")]
        removed = [p for p, _ in older if not os.path.exists(p)]
        with self._lock:  # the books and the capture's end at once: the history may let go of it after
            gone, failed = self.files.enforce(info, on_disk, removed)
            for c in failed:
                self._end(c, names.CAPTURE_FAILED, f"{c.bytes} bytes: over the byte cap ({self.cfg.max_mb:g} MB)")
            if info.state == names.CAPTURE_EXPORTING:
                self._end(info, names.CAPTURE_DONE)
        for path in gone:
            with contextlib.suppress(OSError):
                os.remove(path)
        logger.info("sglang-ctxprof: capture %s (%s) done: %d steps, %d bytes, export %.0f ms -> %s",
                    info.id, info.trigger, len(info.step_ids), info.bytes, info.export_ms, path)

    # ---- reading ---------------------------------------------------------------------------------------
    def find(self, cid: str) -> Optional[CaptureInfo]:
        return next((c for c in list(self.history) if c.id == cid), None)

    def for_rid(self, rid: str) -> list[dict[str, Any]]:
        return [c.to_dict() for c in list(self.history) if rid in c.rids or c.rid == rid]

    def status(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "budget": {"interval_s": c.interval_s, "max_steps": c.max_steps, "steps": c.steps,
                       "max_mb": c.max_mb, "dir": c.dir},
            "triggers": self.triggers.status(),
            "fired": dict(self.fired), "suppressed": dict(self.suppressed),
            "deleted": self.files.deleted, "bytes_kept": self.files.bytes_kept,
            "captures": [x.to_dict() for x in list(self.history)],
        }

