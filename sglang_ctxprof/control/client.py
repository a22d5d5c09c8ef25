"""HTTP-process side of the control channel: one command to every DP group, one payload each.

The client is given the two SGLang-facing callables by the wiring (``plugin.py``): how to reach
the tokenizer manager and how to build SGLang's ``GetInternalStateReq`` from a rid (both in
``collect.adapter``), so this module imports nothing of SGLang.

A scheduler answers between two of its steps.  One that has not answered within ``timeout_s`` (a
hung rank, a step that does not end) gets the caller :class:`NoAnswer` (the routes' 504), and the
call is left to finish rather than cancelled: SGLang's communicator hands each answer to the call
in flight, so a call cancelled mid-way would leave its late answer to the next command, which
would then serve another command's payload.  A caller that goes away (its client hung up) leaves
its call to finish the same way.  While a call nobody awaits is out and at least ``timeout_s`` old,
every new command is refused at once with :class:`NoAnswer` instead of queueing behind it: a hung
rank holds one call, not one per reader, and a read never waits on it for longer than ``timeout_s``
(a younger one, its caller just gone, is an ordinary call in flight: commands queue behind it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from ..model.config import CONTROL_TIMEOUT_S
from ..model.names import ENV_CONTROL_TIMEOUT_S
from .protocol import encode, payload_of


class NoAnswer(Exception):
    """A scheduler has not answered a control command in time (the routes answer 504)."""


def _retrieve(call: "asyncio.Future[Any]") -> None:
    """A call nobody awaits any more: take its outcome, so an exception is not reported as lost."""
    if not call.cancelled():
        call.exception()


class ControlClient:
    def __init__(self, tokenizer_manager: Callable[[], Any], make_request: Callable[[str], Any],
                 timeout_s: float = CONTROL_TIMEOUT_S, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._tokenizer_manager = tokenizer_manager
        self._make_request = make_request
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall = wall  # sent with every command (``now``): the clock every rank judges deadlines by
        self._left: list[tuple[asyncio.Future[Any], str, float]] = []  # calls nobody awaits: (call, cmd, sent)
        self.late_calls = 0  # calls that ran past ``timeout_s``
        self.refused = 0  # commands refused while a late call was out

    async def ask(self, cmd: str, **args: Any) -> list[dict[str, Any]]:
        """Send ``cmd`` to every DP group's scheduler, with ``now`` (this process's clock, unless
        ``args`` give one); their ``ctx_profile`` payloads, in rank order.
        Raises :class:`NoAnswer` when they have not all answered within ``timeout_s``, or at once
        while an earlier call is still waiting for its answer past that time."""
        self._left = [c for c in self._left if not c[0].done()]
        if self._left and self._clock() - self._left[0][2] >= self.timeout_s:
            self.refused += 1
            _, late_cmd, since = self._left[0]
            raise NoAnswer(f"a scheduler has not answered the {late_cmd!r} command sent "
                           f"{self._clock() - since:.0f} s ago; try again later")
        tm = self._tokenizer_manager()
        tm.auto_create_handle_loop()
        sent = self._clock()
        rid = encode(cmd, **{"now": self._wall(), **args})
        call = asyncio.ensure_future(tm.get_internal_state_communicator(self._make_request(rid)))
        try:
            done, _ = await asyncio.wait((call,), timeout=self.timeout_s)
        except asyncio.CancelledError:  # our caller went away: the call finishes on its own
            self._leave(call, cmd, sent)
            raise
        if not done:
            self._leave(call, cmd, sent)
            self.late_calls += 1
            raise NoAnswer(f"no answer from every scheduler to {cmd!r} within {self.timeout_s:g} s "
                           f"({ENV_CONTROL_TIMEOUT_S}); a scheduler may be hung or in a long step")
        return [payload_of(getattr(o, "internal_state", None)) for o in call.result()]

    def _leave(self, call: "asyncio.Future[Any]", cmd: str, sent: float) -> None:
        """Leave ``call`` to finish with nobody awaiting it; the oldest such call not answered yet is
        the one later commands are refused behind, once it is ``timeout_s`` old (calls are sent in
        order, so the oldest is the first of the list)."""
        call.add_done_callback(_retrieve)
        self._left.append((call, cmd, sent))
