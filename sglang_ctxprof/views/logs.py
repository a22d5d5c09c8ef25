"""Structured log events from the scheduler side, with structlog, without touching anyone's logging.

Events (names in ``names.py``):

* ``slow_step``: every field of a decode step record whose step span exceeded the policy's
  ``slow_step_ms``; rate-limited (``SGLANG_CTXPROF_LOG_SLOW_STEPS_PER_MIN``, default 6), the next
  emitted event says how many were ``suppressed``;
* ``slow_request``: when a request the policy calls slow finishes, with its summary and the reason;
* ``request_aborted``: one per request SGLang aborted while it waited (``aborted``: ``queued`` or
  ``retracted``, as ``/ctx_profile/requests`` says), with its steps, whatever the policy;
* ``ctx_profile_summary``: every ``SGLANG_CTXPROF_LOG_SUMMARY_S`` seconds (default 60, 0 = off) the
  window's steps, requests, slow counts, step times and tok/s; at ``debug`` level when idle.

Configured by the configuration's ``logs`` part (:class:`~sglang_ctxprof.model.config.LogSettings`).
Output: ``SGLANG_CTXPROF_LOG=json`` (one JSON object a line) or ``text`` (key=value, the default) or
``off``; to ``SGLANG_CTXPROF_LOG_FILE`` (a path, ``stderr`` (default) or ``stdout``); minimum level
``SGLANG_CTXPROF_LOG_LEVEL`` (default ``info``).

Lines are written by :class:`Lines`: to a regular file at once (it never blocks; a full disk
raises, and the guard turns the ``logs`` component off); to a pipe, a terminal or anything else
(stderr piped to a log collector) by a writer thread of its own from a bounded queue, so a reader
that stops reading never stalls the recorder's drain thread: past ``LINE_QUEUE`` waiting lines a
line is dropped and counted (``lines_dropped`` in the status).

The logger is built with ``structlog.wrap_logger`` and our own processor chain.  We never call
``structlog.configure`` and never touch the ``logging`` module's root or SGLang's loggers, so
SGLang's log format stays exactly as it was.  structlog (a dependency of the package) is imported
when the first log view is built, not when this module is.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Optional

from ..model import names
from ..model.config import LOG_LEVELS, LogSettings
from ..model.names import KIND_DECODE
from ..model.records import StepRecord
from .policy import TracePolicy, max_step_ms

def _open(dest: str) -> Any:
    if dest == "stderr":
        return sys.stderr
    if dest == "stdout":
        return sys.stdout
    # O_NONBLOCK: a FIFO with no reader fails at once (ENXIO) where a plain open would wait for one,
    # at the scheduler's start; then blocking again (a slow reader is the writer thread's, ``Lines``)
    fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", buffering=1)  # line-buffered: one event per line, readable at once


LINE_QUEUE = 10_000  # lines waiting for a slow pipe before one is dropped
CLOSE_S = 2.0  # the longest stop() waits for the writer thread


class Lines:
    """structlog's logger for our events (every level writes the rendered line).  A regular file is
    written at once; anything else from a bounded queue by a daemon writer thread: a write error
    there is raised by the next line's call, so the ``logs`` component fails as it would at once."""

    def __init__(self, file: Any, cap: int = LINE_QUEUE) -> None:
        self.file = file
        self.cap = cap
        self.dropped = 0
        self.error: Optional[BaseException] = None
        try:
            regular = stat.S_ISREG(os.fstat(file.fileno()).st_mode)
        except (AttributeError, OSError, ValueError):  # no descriptor (an in-memory stream): at once
            regular = True
        self._q: Optional[deque[str]] = None if regular else deque()
        self._lock = threading.Lock()  # the drain and summary threads both log: one writer, one start
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    def msg(self, message: str) -> None:
        q = self._q
        if q is None:
            with self._lock:
                self.file.write(message + "\n")
                self.file.flush()
            return
        if self.error is not None:
            raise self.error
        if len(q) >= self.cap:
            self.dropped += 1
            return
        q.append(message)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._write, name="ctxprof-log-writer", daemon=True)
                    self._thread.start()
        self._wake.set()

    debug = info = warning = warn = error = err = critical = exception = fatal = failure = log = msg

    def _write(self) -> None:
        q = self._q
        assert q is not None
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                while q:
                    self.file.write(q.popleft() + "\n")
                self.file.flush()
            except Exception as exc:  # noqa: BLE001 - reported by the next line's call
                self.error = exc
                return
            if self._stop and not q:
                return

    def close(self, timeout: float = CLOSE_S) -> None:
        """Let the writer write what waits, for ``timeout`` seconds at most (a stuck reader)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)


def make_logger(cfg: LogSettings, renderer: Any = None, file: Any = None) -> Any:
    """A structlog logger with our own processors only (no global configuration)."""
    import structlog

    if renderer is None:
        renderer = (structlog.processors.JSONRenderer(sort_keys=False) if cfg.fmt == "json"
                    else structlog.processors.KeyValueRenderer(key_order=["event", "level", "timestamp"]))
    processors = [structlog.processors.add_log_level,
                  structlog.processors.TimeStamper(fmt="iso", utc=True),
                  renderer]
    return structlog.wrap_logger(Lines(file if file is not None else _open(cfg.dest)),
                                 processors=processors,
                                 wrapper_class=structlog.make_filtering_bound_logger(cfg.level),
                                 context_class=dict, cache_logger_on_first_use=True,
                                 logger_name=names.LOGGER_NAME)


class _Window:
    def __init__(self) -> None:
        self.steps = 0
        self.step_ms = 0.0
        self.step_ms_max = 0.0
        self.committed = 0
        self.accepted = 0
        self.req_steps = 0
        self.requests = 0
        self.slow_requests = 0
        self.slow_steps = 0


class LogView:
    def __init__(self, cfg: LogSettings, policy: Callable[[], TracePolicy], logger: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.policy = policy
        self.log = logger if logger is not None else make_logger(cfg)
        self.clock = clock
        self._lock = threading.Lock()
        self._win = _Window()
        self._win_t0 = clock()
        self._allow = float(cfg.slow_steps_per_min)  # token bucket, refilled per minute
        self._allow_t = clock()
        self.suppressed = 0
        self.emitted = {names.EVENT_SLOW_STEP: 0, names.EVENT_SLOW_REQUEST: 0, names.EVENT_SUMMARY: 0,
                        names.EVENT_REQUEST_ABORTED: 0}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- per step (recorder drain thread) ----------------------------------------------------------
    def on_step(self, rec: StepRecord) -> None:
        if rec.kind != KIND_DECODE:
            return
        slow = self.policy().step_is_slow(rec.step_ms)
        with self._lock:
            w = self._win
            w.steps += 1
            w.step_ms += rec.step_ms
            w.step_ms_max = max(w.step_ms_max, rec.step_ms)
            w.committed += sum(rec.committed)
            w.accepted += sum(rec.accepted)
            w.req_steps += rec.batch_size
            w.slow_steps += int(slow)
            if not slow or not self._take():
                if slow:
                    self.suppressed += 1
                return
            suppressed, self.suppressed = self.suppressed, 0
        d = rec.to_dict()
        d.pop("trace_parents", None)
        self.log.warning(names.EVENT_SLOW_STEP, suppressed=suppressed, **d)
        self.emitted[names.EVENT_SLOW_STEP] += 1

    def _take(self) -> bool:
        per_min = self.cfg.slow_steps_per_min
        now = self.clock()
        self._allow = min(float(per_min), self._allow + (now - self._allow_t) * per_min / 60.0)
        self._allow_t = now
        if self._allow >= 1.0:
            self._allow -= 1.0
            return True
        return False

    # ---- per finished request -----------------------------------------------------------------------
    def on_request(self, req: Mapping[str, Any], slow_reason: str, traced: bool) -> None:
        with self._lock:
            self._win.requests += 1
            self._win.slow_requests += int(bool(slow_reason))
        if not slow_reason:
            return
        self.log.warning(
            names.EVENT_SLOW_REQUEST, rid=req["rid"], reason=slow_reason, traced=traced,
            prompt_tokens=req.get("prompt_tokens"), steps=req.get("steps"),
            committed=req.get("committed"), accepted=req.get("accepted"),
            accepted_per_step=round(float(req.get("accepted_per_step") or 0.0), 4),
            decode_tok_s=round(float(req.get("decode_tok_s") or 0.0), 3),
            decode_ms=round(float(req.get("decode_ms") or 0.0), 3),
            prefill_ms=round(float(req.get("prefill_ms") or 0.0), 3),
            ctx_first=req.get("ctx_first"), ctx_last=req.get("ctx_last"),
            max_step_ms=round(max_step_ms(req), 3), partial=bool(req.get("partial")),
            trace_parent=req.get("trace_parent") or None)
        self.emitted[names.EVENT_SLOW_REQUEST] += 1

    def on_abort(self, req: Mapping[str, Any], traced: bool) -> None:
        """One ``request_aborted`` event per request SGLang aborted while it waited."""
        self.log.warning(names.EVENT_REQUEST_ABORTED, rid=req["rid"], aborted=req["aborted"], traced=traced,
                         steps=req.get("steps"), retractions=req.get("retractions"),
                         prompt_tokens=req.get("prompt_tokens"), committed=req.get("committed"),
                         trace_parent=req.get("trace_parent") or None)
        self.emitted[names.EVENT_REQUEST_ABORTED] += 1

    # ---- periodic summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Close the current window and return its fields (also used by the timer)."""
        now = self.clock()
        with self._lock:
            w, self._win = self._win, _Window()
            t0, self._win_t0 = self._win_t0, now
        span = max(1e-9, now - t0)
        return {"window_s": round(span, 3), "steps": w.steps, "requests_finished": w.requests,
                "slow_requests": w.slow_requests, "slow_steps": w.slow_steps,
                "step_ms_mean": round(w.step_ms / w.steps, 3) if w.steps else 0.0,
                "step_ms_max": round(w.step_ms_max, 3),
                "accepted_per_step": round(w.accepted / w.req_steps, 4) if w.req_steps else 0.0,
                "committed_tok_s": round(w.committed / span, 3)}

    def emit_summary(self) -> dict[str, Any]:
        s = self.summary()
        level = "info" if s["steps"] or s["requests_finished"] else "debug"
        getattr(self.log, level)(names.EVENT_SUMMARY, **s)
        if LOG_LEVELS.index(level) >= LOG_LEVELS.index(self.cfg.level):  # a line the level let through
            self.emitted[names.EVENT_SUMMARY] += 1
        return s

    def start(self) -> None:
        """The summary thread, with a stop event of its own (a paused one that outlived its join
        stays stopped)."""
        if self.cfg.summary_s > 0 and self._thread is None:
            self._stop = stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, args=(stop,), name="ctxprof-log-summary",
                                            daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Profiling switched off: the summary thread ends (:meth:`start` brings it back); the
        destination stays open."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(CLOSE_S)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.cfg.summary_s):
            try:
                self.emit_summary()
            except Exception:  # noqa: BLE001 - a broken log destination must not kill the thread
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_S)
            self._thread = None
        lines = self._lines()
        if lines is not None:
            lines.close()

    def _lines(self) -> Optional[Lines]:
        """The structlog logger's writer, when it is ours (a test may pass any logger)."""
        inner = getattr(self.log, "_logger", None)
        return inner if isinstance(inner, Lines) else None

    def status(self) -> dict[str, Any]:
        lines = self._lines()
        return {"format": self.cfg.fmt, "dest": self.cfg.dest, "emitted": dict(self.emitted),
                "suppressed_slow_steps": self.suppressed,
                "lines_dropped": lines.dropped if lines is not None else 0}
