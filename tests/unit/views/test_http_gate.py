"""views/http_gate: the read routes' builds keep to a share of the time (a cool-down in proportion to
the last build's busy time, waited asynchronously), readers that arrive while a read waits to start
share it, and a reply is never older than its request.  An injected clock, sleep and busy meter: no
real time is measured."""

from __future__ import annotations

import asyncio

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.views.http_gate import ReadGate


class Rig:
    """A fake clock that a sleep advances, and a busy meter each work item charges."""

    def __init__(self, share: float) -> None:
        self.now, self.busy, self.slept, self.runs = 100.0, 0.0, [], []
        self.gate = ReadGate(share, clock=lambda: self.now, sleep=self.sleep, meter=lambda: self.busy)

    async def sleep(self, s: float) -> None:
        self.slept.append(round(s, 9))
        self.now += s
        await asyncio.sleep(0)

    def work(self, name: str, cost: float, wall: float = 0.0, hold: asyncio.Event | None = None):
        async def go():
            self.runs.append(name)
            if hold is not None:
                await hold.wait()
            self.busy += cost
            self.now += wall
            return f"{name}@{len(self.runs)}"
        return go


def test_cooldown_is_in_proportion_to_the_last_builds_busy_time():
    r = Rig(0.2)

    async def go():
        a = await r.gate.run("p", r.work("a", cost=0.05, wall=0.06))
        b = await r.gate.run("p", r.work("b", cost=0.01))
        c = await r.gate.run("d", r.work("c", cost=0.0))
        return a, b, c

    assert asyncio.run(go()) == ("a@1", "b@2", "c@3")
    assert r.slept == [0.2, 0.04]  # 0.05 s busy at a share of 0.2: 0.2 s rest; then 0.01 -> 0.04
    assert r.gate.runs == 3 and r.gate.waited_s == pytest.approx(0.24)


def test_an_idle_gate_and_a_share_of_one_never_wait():
    r = Rig(1.0)

    async def go():
        for i in range(3):
            await r.gate.run("p", r.work(str(i), cost=1.0))

    asyncio.run(go())
    assert r.slept == [] and r.gate.runs == 3
    r = Rig(0.5)
    r.now = 5.0  # long after any read: the first one starts at once
    asyncio.run(r.gate.run("p", r.work("x", cost=2.0)))
    assert r.slept == []


def test_readers_waiting_for_one_route_share_a_run_and_replies_are_never_older_than_the_request():
    r = Rig(0.5)
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.run("p", r.work("a", cost=0.1, hold=hold)))
        await asyncio.sleep(0)  # a is running (holds the gate)
        late = [asyncio.create_task(r.gate.run("p", r.work(f"b{i}", cost=0.1))) for i in range(3)]
        other = asyncio.create_task(r.gate.run("q", r.work("c", cost=0.1)))
        await asyncio.sleep(0)
        hold.set()
        return await first, await asyncio.gather(*late), await other

    first, late, other = asyncio.run(go())
    assert first == "a@1"
    assert late == ["b0@2"] * 3  # arrived while a ran: not a's reply, one newer run shared by three
    assert other == "c@3" and r.runs == ["a", "b0", "c"]
    assert r.gate.shared == 2 and r.slept == [0.1, 0.1]


def test_a_failed_read_fails_its_sharers_and_the_gate_goes_on():
    r = Rig(1.0)
    hold = asyncio.Event()

    async def boom():
        raise RuntimeError("scheduler gone")

    async def go():
        first = asyncio.create_task(r.gate.run("p", r.work("a", cost=0.0, hold=hold)))
        await asyncio.sleep(0)
        bad = [asyncio.create_task(r.gate.run("p", boom)) for _ in range(2)]
        await asyncio.sleep(0)
        hold.set()
        await first
        out = await asyncio.gather(*bad, return_exceptions=True)
        return out, await r.gate.run("p", r.work("z", cost=0.0))

    out, after = asyncio.run(go())
    assert [type(e) for e in out] == [RuntimeError, RuntimeError] and after == "z@2"


def test_a_gate_serves_a_new_event_loop():
    r = Rig(1.0)
    asyncio.run(r.gate.run("p", r.work("a", cost=0.0)))
    assert asyncio.run(r.gate.run("p", r.work("b", cost=0.0))) == "b@2"


def test_the_share_is_a_setting_with_clear_errors():
    assert CtxProfConfig.from_env({}).read_share == 0.1
    assert CtxProfConfig.from_env({names.ENV_READ_SHARE: "1"}).read_share == 1.0
    for bad in ("0", "1.5", "-0.1", "half"):
        with pytest.raises(ValueError, match=names.ENV_READ_SHARE):
            CtxProfConfig.from_env({names.ENV_READ_SHARE: bad})
    with pytest.raises(ValueError):
        ReadGate(0.0)
