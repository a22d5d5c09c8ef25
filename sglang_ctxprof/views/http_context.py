"""What the ``/ctx_profile`` route modules read through: one :class:`ReadContext` per installed app.

``views.http.install_routes`` makes one context (the control client that reaches the schedulers,
the HTTP process's read gate, the configuration, the plain-decode reference store, the schedulers'
last states: :class:`KnownStates`, so an unchanged state is not sent twice) and hands it to
each route module's factory (``routes(rc)`` in ``views.http``, ``http_plain``, ``http_trace``,
``http_capture``), which returns its :class:`Route` rows with handlers bound to that context.  No
route module keeps a client in a global: two apps installed in one process each read through
their own client.  ``uninstall_routes`` removes exactly the routes its install added (kept in
:data:`INSTALLED` on the app's state), as an OTel instrumentation's uninstrument mirrors its
instrument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol

from starlette.requests import Request

from ..model.config import CtxProfConfig
from ..model.names import CMD_REQUESTS, CMD_SNAPSHOT, PAYLOAD_SCHED_S, RID_MALFORMED
from ..model.rids import lookup_rid, valid_rid
from .http_build import charge_schedulers, off_loop
from .http_gate import ReadGate
from .http_guard import error

if TYPE_CHECKING:
    from .http_plain import PlainReference

Payloads = list[dict[str, Any]]  # every DP group's answer to one control command
Handler = Callable[[Request], Awaitable[Any]]
INSTALLED = "ctxprof_routes"  # the app.state attribute holding the routes an install added


class Asker(Protocol):
    """The control client's one method the routes use (``control.client.ControlClient.ask``)."""

    async def ask(self, cmd: str, **args: Any) -> Payloads: ...


@dataclass
class PlainStore:
    """The registered plain-decode reference (``views.http_plain.PlainReference``), or None; it
    lives in the HTTP process's memory for as long as the routes are installed."""

    ref: Optional[PlainReference] = None


class KnownStates:
    """The last state each scheduler process answered, by the version it gave (``Profiler.state``),
    so a rank whose state has not changed since answers ``unchanged`` instead of writing and
    sending it again (an idle server's reads, a dashboard's polls).  One entry per process (``pid``
    of its status), at most ``size``; the event loop's only (no lock)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._by_pid: dict[int, tuple[str, Any]] = {}

    def versions(self) -> list[str]:
        return [v for v, _ in self._by_pid.values()]

    def fill(self, payloads: Payloads) -> Optional[Payloads]:
        """The payloads with each ``unchanged`` answer given its state back, remembering the new
        states; None when an answer names a version not held here (ask again, naming none)."""
        out = []
        for p in payloads:
            if "unchanged" in p:
                held = self._by_pid.get(_pid(p))
                if held is None or held[0] != p["unchanged"]:
                    return None
                p = {**p, "state": held[1], "version": held[0]}
                del p["unchanged"]
            elif "state" in p and isinstance(p.get("version"), str) and _pid(p) is not None:
                if len(self._by_pid) >= self.size and _pid(p) not in self._by_pid:
                    self._by_pid.pop(next(iter(self._by_pid)))
                self._by_pid[_pid(p)] = (p["version"], p["state"])  # type: ignore[index]
            out.append(p)
        return out


def _pid(p: dict[str, Any]) -> Optional[int]:
    st = p.get("status")
    pid = st.get("pid") if isinstance(st, dict) else None
    return pid if isinstance(pid, int) else None


@dataclass(frozen=True)
class ReadContext:
    client: Asker
    gate: ReadGate
    config: CtxProfConfig
    plain: PlainStore = field(default_factory=PlainStore)
    states: KnownStates = field(default_factory=KnownStates)

    async def ask(self, cmd: str, **args: Any) -> Payloads:
        """Send one control command to every DP group and return their ctx_profile payloads; the
        longest scheduler time among them counts toward the read gate's cool-down."""
        payloads = await self.client.ask(cmd, **args)
        charge_schedulers(max((_sched_s(p) for p in payloads), default=0.0))
        return payloads

    async def snapshot(self) -> Payloads:
        """Every DP group's status and state (``snapshot``), naming the states held here so an
        unchanged one is not sent again; the answers come back whole, as a plain ``snapshot`` gives."""
        known = self.states.versions()
        payloads = await self.ask(CMD_SNAPSHOT, known=known) if known else await self.ask(CMD_SNAPSHOT)
        out = self.states.fill(payloads)
        if out is None:  # a rank named a state not held here (another app's reads): ask for it whole
            out = self.states.fill(await self.ask(CMD_SNAPSHOT)) or []
        return out

    async def read(self, cmd: str, ask: dict[str, Any], reply: Callable[..., Any], *args: Any) -> Any:
        """Ask every DP group, then ``reply(payloads, *args)`` on the build thread (off the event loop)."""
        return await off_loop(reply, await self.ask(cmd, **ask), *args)

    async def request(self, rid: str, key: str, build: Callable[[dict[str, Any]], Any]) -> Any:
        """One request's summary with its step rows, ``build(summary)`` on the build thread; through
        the read gate (``key`` names the view), as every read that costs the schedulers: a request
        of thousands of steps is tens of ms there and a MB to serialize.  400 for a malformed rid, 404
        when no rank holds it, 503 when none answered."""
        if not valid_rid(rid):
            return error(400, RID_MALFORMED)
        return await self.gate.serve((key, rid), lambda: self.read(CMD_REQUESTS, {"rid": lookup_rid(rid)},
                                                                   _one_request, rid, build))


def _sched_s(payload: Any) -> float:
    v = payload.get(PAYLOAD_SCHED_S) if isinstance(payload, dict) else None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else 0.0


def _one_request(payloads: Payloads, rid: str, build: Callable[[dict[str, Any]], Any]) -> Any:
    rows = [r for p in payloads for r in p.get("requests", [])]
    if rows:
        return build(rows[0])
    errors = [p["error"] for p in payloads if "error" in p]
    if errors and len(errors) == len(payloads):
        return error(503, "; ".join(errors))
    return error(404, f"request {rid!r} not found in the recent-request ring")


@dataclass(frozen=True)
class Route:
    """One route a factory returns: ``admin`` routes take SGLang's ADMIN_OPTIONAL auth level;
    ``guarded`` ones run under the ``http`` fault guard (all but the test-only fault switch)."""

    path: str
    handler: Handler
    method: str = "GET"
    admin: bool = False
    guarded: bool = True
