"""HTTP-process side of the control channel: one command to every DP group, one payload each.

The client is given the two SGLang-facing callables by the wiring (``plugin.py``): how to reach
the tokenizer manager and how to build SGLang's ``GetInternalStateReq`` from a rid (both in
``collect.adapter``), so this module imports nothing of SGLang.
"""

from __future__ import annotations

from typing import Any, Callable

from .protocol import encode, payload_of


class ControlClient:
    def __init__(self, tokenizer_manager: Callable[[], Any], make_request: Callable[[str], Any]) -> None:
        self._tokenizer_manager = tokenizer_manager
        self._make_request = make_request

    async def ask(self, cmd: str, **args: Any) -> list[dict[str, Any]]:
        """Send ``cmd`` to every DP group's scheduler; their ``ctx_profile`` payloads, in rank order."""
        tm = self._tokenizer_manager()
        tm.auto_create_handle_loop()
        outs = await tm.get_internal_state_communicator(self._make_request(encode(cmd, **args)))
        return [payload_of(getattr(o, "internal_state", None)) for o in outs]
