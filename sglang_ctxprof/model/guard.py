"""Fault isolation for our own code inside SGLang.

Each component (``COMPONENTS``: the hooks, the recorder, the aggregator, each sink, the HTTP routes
and the control commands) runs its work under :meth:`Guard.run`. The first failure of a component
disables that component, logs one warning with the traceback (never one per step) and is reported as
``degraded`` in ``/ctx_profile``. SGLang's own calls never run inside a guard, so its exceptions and
return values pass untouched.

Every component asks :meth:`Guard.ok` before its work (or runs it through :meth:`Guard.run`,
which asks), and that is the only place a fault plan is checked: call sites never mention it.
``SGLANG_CTXPROF_FAULT=<component>`` (test only) makes that component fail at its first check,
with an :class:`InjectedFault` and its traceback, so tests can prove the isolation on a real
server.  ``SGLANG_CTXPROF_FAULT=runtime`` breaks nothing at start but lets a test pick the
component later (:meth:`Guard.set_fault`, reached through the test-only ``POST /ctx_profile/fault``
route), so one server can prove every component.  Without a plan at start ``ok`` is the plain
membership test: the plan costs nothing in production.
"""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any, Callable

logger = logging.getLogger(__name__)

COMPONENTS = ("hooks", "recorder", "aggregator", "exporter", "logs", "metrics", "http", "control", "capture")
HTTP = "http"  # the one component of the HTTP process (the routes' own guard); the others are a scheduler's
SCHEDULER_COMPONENTS = tuple(c for c in COMPONENTS if c != HTTP)
RECORDING = ("hooks", "recorder", "aggregator")  # after a failure of one, the rank records no more steps
FAULT_RUNTIME = "runtime"  # SGLANG_CTXPROF_FAULT value that enables the runtime fault switch


class InjectedFault(RuntimeError):
    """Raised on purpose by the test-only fault switch."""


class Guard:
    def __init__(self, fault: str = "") -> None:
        self._lock = threading.Lock()
        self.disabled: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []  # told after a component fails or all heal
        self.fault = fault
        self.switchable = fault == FAULT_RUNTIME
        if fault:  # a fault plan was set at start: only then does ok() look at it
            self.ok = self._ok_or_inject  # type: ignore[method-assign]

    def ok(self, component: str) -> bool:
        """May ``component`` do its work?  False once it has failed."""
        return component not in self.disabled

    def _ok_or_inject(self, component: str) -> bool:
        if self.fault == component and component not in self.disabled:
            try:
                raise InjectedFault(f"injected fault in {component} (SGLANG_CTXPROF_FAULT)")
            except InjectedFault as exc:
                self.fail(component, exc)
        return component not in self.disabled

    def set_fault(self, component: str) -> None:
        """Test-only runtime switch: break ``component`` from now on ("" heals and re-enables all)."""
        if not self.switchable:
            raise PermissionError("fault switch is off (start with SGLANG_CTXPROF_FAULT=runtime)")
        if component and component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; use one of {', '.join(COMPONENTS)}")
        self.fault = component or FAULT_RUNTIME
        if not component:
            self.clear()

    def listen(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` after a component fails and after :meth:`clear` (on the thread that failed:
        ``fn`` must be quick; its own failure is logged, never raised)."""
        self._listeners.append(fn)

    def _tell(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a listener never fails the failing path
                logger.warning("sglang-ctxprof: a fault listener failed: %r", exc)

    def fail(self, component: str, exc: BaseException) -> None:
        with self._lock:
            if component in self.disabled:
                return
            self.disabled[component] = f"{type(exc).__name__}: {exc}"
        logger.warning(
            "sglang-ctxprof: component %r failed and is now disabled; SGLang continues unaffected.\n%s",
            component, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        self._tell()

    def run(self, component: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run our code ``fn``; on failure disable ``component`` and return None."""
        if not self.ok(component):
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - isolating our code from the host is the point
            self.fail(component, exc)
            return None

    def status(self) -> dict[str, Any] | None:
        with self._lock:
            if not self.disabled:
                return None
            return {"components": dict(self.disabled)}

    def clear(self) -> None:
        with self._lock:
            self.disabled.clear()
        self._tell()
