"""What the ``/ctx_profile`` route modules read through: one :class:`ReadContext` per installed app.

``views.http.install_routes`` makes one context (the control client that reaches the schedulers,
the HTTP process's read gate, the configuration, the plain-decode reference store) and hands it to
each route module's factory (``routes(rc)`` in ``views.http``, ``http_plain``, ``http_trace``,
``http_capture``), which returns its :class:`Route` rows with handlers bound to that context.  No
route module keeps a client in a global: two apps installed in one process each read through
their own client.  ``uninstall_routes`` removes exactly the routes its install added (kept in
:data:`INSTALLED` on the app's state), as an OTel instrumentation's uninstrument mirrors its
instrument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol

from starlette.requests import Request

from ..model.config import CtxProfConfig
from .http_build import off_loop
from .http_gate import ReadGate

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


@dataclass(frozen=True)
class ReadContext:
    client: Asker
    gate: ReadGate
    config: CtxProfConfig
    plain: PlainStore = field(default_factory=PlainStore)

    async def ask(self, cmd: str, **args: Any) -> Payloads:
        """Send one control command to every DP group and return their ctx_profile payloads."""
        return await self.client.ask(cmd, **args)

    async def read(self, cmd: str, ask: dict[str, Any], reply: Callable[..., Any], *args: Any) -> Any:
        """Ask every DP group, then ``reply(payloads, *args)`` on the build thread (off the event loop)."""
        return await off_loop(reply, await self.ask(cmd, **ask), *args)


@dataclass(frozen=True)
class Route:
    """One route a factory returns: ``admin`` routes take SGLang's ADMIN_OPTIONAL auth level;
    ``guarded`` ones run under the ``http`` fault guard (all but the test-only fault switch)."""

    path: str
    handler: Handler
    method: str = "GET"
    admin: bool = False
    guarded: bool = True
