"""control/client: a command to every scheduler through SGLang's own fan-out communicator, and what
happens when a scheduler does not answer: a 504's ``NoAnswer``, the late call left to finish (never
cancelled into the next command's answer), and no new command queued behind it meanwhile."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sglang.srt.managers.communicator import FanOutCommunicator
from sglang_ctxprof.control.client import ControlClient, NoAnswer
from sglang_ctxprof.control.protocol import decode
from sglang_ctxprof.model.names import CONTROL_KEY


class Schedulers:
    """The tokenizer manager's side as SGLang has it: its real ``FanOutCommunicator`` in queueing
    mode, whose ``send`` goes to ``fan_out`` schedulers that answer when the test says so."""

    def __init__(self, fan_out: int = 1) -> None:
        self.sent: list[str] = []
        self.comm = FanOutCommunicator(lambda req: self.sent.append(req.rid), fan_out)
        self.fan_out = fan_out

    def tokenizer_manager(self) -> SimpleNamespace:
        return SimpleNamespace(auto_create_handle_loop=lambda: None, get_internal_state_communicator=self.comm)

    def answer(self, k: int) -> None:
        """Every scheduler answers the ``k``-th command sent (its payload names that command)."""
        cmd = decode(self.sent[k])["cmd"]
        for rank in range(self.fan_out):
            self.comm.handle_recv(SimpleNamespace(internal_state={CONTROL_KEY: {"cmd": cmd, "rank": rank, "k": k}}))


def _client(s: Schedulers, timeout_s: float = 0.05) -> ControlClient:
    return ControlClient(s.tokenizer_manager, lambda rid: SimpleNamespace(rid=rid), timeout_s=timeout_s)


async def _answer_soon(s: Schedulers, k: int) -> None:
    while len(s.sent) <= k:
        await asyncio.sleep(0.001)
    s.answer(k)


def test_every_scheduler_answers_in_rank_order():
    async def go():
        s = Schedulers(fan_out=2)
        c = _client(s, timeout_s=5)
        asyncio.ensure_future(_answer_soon(s, 0))
        return await c.ask("status")

    assert asyncio.run(go()) == [{"cmd": "status", "rank": 0, "k": 0}, {"cmd": "status", "rank": 1, "k": 0}]


def test_a_late_call_is_refused_to_others_then_its_answer_is_never_served_as_another_commands():
    async def go():
        s = Schedulers()
        c = _client(s)
        with pytest.raises(NoAnswer, match="within"):
            await c.ask("status")  # the scheduler hangs
        with pytest.raises(NoAnswer, match="has not answered the 'status' command"):
            await c.ask("requests", slowest=5)  # refused at once: not sent, not queued
        assert len(s.sent) == 1 and c.late_calls == 1 and c.refused == 1
        s.answer(0)  # the hung scheduler comes back and answers the old command
        await asyncio.sleep(0)
        asyncio.ensure_future(_answer_soon(s, 1))
        return await c.ask("requests", slowest=5)

    assert asyncio.run(go()) == [{"cmd": "requests", "rank": 0, "k": 1}]


def test_a_caller_that_goes_away_leaves_its_call_to_its_own_answer():
    async def go():
        s = Schedulers()
        c = _client(s, timeout_s=5)
        first = asyncio.ensure_future(c.ask("status"))
        await asyncio.sleep(0.01)
        first.cancel()  # its HTTP client hung up
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(c.ask("requests", slowest=5))  # queued behind the first call
        await asyncio.sleep(0.01)
        s.answer(0)  # the first call's answer ends the first call ...
        asyncio.ensure_future(_answer_soon(s, 1))
        return await second  # ... and the second gets its own

    assert asyncio.run(go()) == [{"cmd": "requests", "rank": 0, "k": 1}]


def test_a_call_its_caller_left_is_refused_behind_once_it_is_late():
    """A caller that goes away leaves its call to finish: while it is young, commands queue behind it
    as behind any call in flight; once it is ``timeout_s`` old and unanswered, they are refused at
    once (before, each waited its own full timeout behind the hung call)."""
    async def go():
        now = [0.0]
        s = Schedulers()
        c = ControlClient(s.tokenizer_manager, lambda rid: SimpleNamespace(rid=rid), timeout_s=0.05,
                          clock=lambda: now[0])
        first = asyncio.ensure_future(c.ask("status"))
        await asyncio.sleep(0.01)
        first.cancel()  # its HTTP client hung up; the scheduler is hung too
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(NoAnswer, match="within"):  # young: not refused; queued behind it, it times out
            await c.ask("requests", slowest=5)
        now[0] = 1.0  # the left call is now past timeout_s
        with pytest.raises(NoAnswer, match="has not answered the 'status' command"):
            await c.ask("requests", slowest=5)
        assert c.refused == 1 and len(s.sent) == 1  # the queued one never got to send
        s.answer(0)  # the hung scheduler answers: the queued call (left by its timeout) goes out
        await _answer_soon(s, 1)
        await asyncio.sleep(0.01)  # ... and gets its answer
        asyncio.ensure_future(_answer_soon(s, 2))
        return await c.ask("requests", slowest=5)

    assert asyncio.run(go()) == [{"cmd": "requests", "rank": 0, "k": 2}]  # its own answer


def test_every_call_left_unanswered_is_tracked_not_only_the_first():
    """Two callers go away while their calls are young; the first call is answered and the scheduler
    then hangs on the second: once that one is late, commands are refused behind it at once."""
    async def go():
        now = [0.0]
        s = Schedulers()
        c = ControlClient(s.tokenizer_manager, lambda rid: SimpleNamespace(rid=rid), timeout_s=5.0,
                          clock=lambda: now[0])
        calls = [asyncio.ensure_future(c.ask("status")), asyncio.ensure_future(c.ask("requests", slowest=1))]
        await asyncio.sleep(0.01)
        for call in calls:
            call.cancel()  # both HTTP clients hung up
        await asyncio.gather(*calls, return_exceptions=True)
        s.answer(0)  # the first is answered; the scheduler hangs on the second (sent now)
        await asyncio.sleep(0.01)
        now[0] = 6.0
        with pytest.raises(NoAnswer, match="has not answered the 'requests' command"):
            await c.ask("status")
        assert len(s.sent) == 2

    asyncio.run(go())


def test_every_command_carries_the_http_clock_unless_it_names_its_own():
    async def go():
        s = Schedulers()
        c = ControlClient(s.tokenizer_manager, lambda rid: SimpleNamespace(rid=rid), timeout_s=5, wall=lambda: 1234.5)
        for k, (cmd, args) in enumerate((("status", {}), ("capture", {"steps": 2, "now": 99.0}))):
            asyncio.ensure_future(_answer_soon(s, k))
            await c.ask(cmd, **args)
        return [decode(rid) for rid in s.sent]

    assert asyncio.run(go()) == [{"cmd": "status", "now": 1234.5}, {"cmd": "capture", "now": 99.0, "steps": 2}]
