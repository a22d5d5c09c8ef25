"""views/http_gate: the read routes' builds keep to a share of the time (a cool-down in proportion to
the last build's busy time, waited asynchronously), readers that arrive while a read waits to start
share it, and a reply is never older than its request.  An injected clock, sleep and busy meter: no
real time is measured."""

from __future__ import annotations

import asyncio
import json

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.views import http_gate
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


def _flood(r: Rig, keys: list, then: list, standing: frozenset = frozenset()) -> tuple[list, list]:
    """One read of ``"p"`` holds the gate while a read of each of ``keys`` arrives, then each of ``then``
    (those in ``standing`` as standing reads); returns what the ``keys`` reads and the ``then`` reads
    got (a result or the exception)."""
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.run("p", r.work("a", cost=0.02, hold=hold)))
        await asyncio.sleep(0)  # a is running (holds the gate)
        flood = [asyncio.create_task(r.gate.run(k, r.work(str(k), cost=0.02))) for k in keys]
        await asyncio.sleep(0)
        late = [asyncio.create_task(r.gate.run(k, r.work(f"late {k}", cost=0.02), standing=k in standing))
                for k in then]
        await asyncio.sleep(0)
        hold.set()
        await first
        return (await asyncio.gather(*flood, return_exceptions=True),
                await asyncio.gather(*late, return_exceptions=True))

    return asyncio.run(go())


def test_distinct_reads_waiting_are_bounded_and_one_beyond_the_bound_is_refused_at_once():
    """500 distinct ``?ctx=`` reads queued behind one: only the first MAX_WAITING wait, so a plain read
    arriving after them is told to come back instead of waiting behind 500 builds."""
    r = Rig(0.5)
    keys = [("diagnosis", n, "json") for n in range(500)]
    flood, late = _flood(r, keys, [("profile", "json"), ("diagnosis", 3, "json")])
    ran = [x for x in flood if isinstance(x, str)]
    refused = [x for x in flood if isinstance(x, http_gate.GateFull)]
    assert len(ran) == http_gate.MAX_WAITING == 16 and len(refused) == 500 - 16
    assert r.runs == ["a"] + [str(k) for k in keys[:16]]  # in arrival order, then nothing else
    assert isinstance(late[0], http_gate.GateFull) and late[0].retry_after_s > 0  # refused, with a hint
    assert late[1] == flood[3]  # the reader of a waiting key shares its run: it needs no slot
    assert r.gate.refused == 500 - 16 + 1 and r.gate.shared == 1
    assert asyncio.run(r.gate.run(("profile", "json"), r.work("z", cost=0.0))) == "z@18"  # the gate goes on


def test_standing_reads_are_admitted_to_a_full_queue_and_run_before_the_reads_waiting_there():
    """One client keeps 16 distinct reads waiting: the standing reads (the live page's, a scraper's)
    are still admitted, and they take turns with the 16: each runs after one of them, not after all."""
    r = Rig(0.5)
    keys = [("diagnosis", n, "json") for n in range(500)]
    standing = [("profile", "json"), ("profile", "prometheus")]
    flood, late = _flood(r, keys, standing + [("diagnosis", 600, "json")], standing=frozenset(standing))
    assert late[:2] == ["late ('profile', 'json')@2", "late ('profile', 'prometheus')@4"]
    assert isinstance(late[2], http_gate.GateFull)  # any other read is still refused at a full queue
    assert r.runs == ["a", f"late {standing[0]}", str(keys[0]), f"late {standing[1]}"] + [str(k) for k in keys[1:16]]
    assert r.gate.refused == 500 - 16 + 1
    # A standing read waiting is shared like any other, and takes no place among the 16.
    ran = [x for x in flood if isinstance(x, str)]
    assert ran == [f"{keys[0]}@3"] + [f"{k}@{i}" for i, k in enumerate(keys[1:16], 5)]


def test_the_pages_periodic_reads_are_never_refused():
    """The live page reads three keys every few seconds; any number of open pages share them."""
    r = Rig(0.5)
    page = [("profile", "json"), ("requests", 20, False), ("diagnosis", None, "json")]
    flood, late = _flood(r, page * 40, page)
    assert not [x for x in flood + late if isinstance(x, Exception)]
    assert r.runs == ["a"] + [str(k) for k in page] and r.gate.refused == 0
    assert late == flood[:3] and r.gate.shared == 3 * 40 - 3 + 3


def test_a_full_gate_is_a_429_with_a_retry_hint():
    r = Rig(0.5)
    r.gate = http_gate.ReadGate(0.5, clock=lambda: r.now, sleep=r.sleep, meter=lambda: r.busy, limit=1)
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.serve("p", r.work("a", cost=0.25, wall=0.5, hold=hold)))
        await asyncio.sleep(0)
        second = asyncio.create_task(r.gate.serve("q", r.work("b", cost=0.0)))
        await asyncio.sleep(0)
        refused = await r.gate.serve("x", r.work("never", cost=0.0))
        hold.set()
        return refused, await first, await second

    refused, first, second = asyncio.run(go())
    assert (first, second) == ("a@1", "b@2") and "never" not in r.runs
    body = json.loads(refused.body)
    assert refused.status_code == 429 and "reads are waiting" in body["error"]
    assert body["retry_after_s"] > 0 and int(refused.headers["Retry-After"]) >= 1
    with pytest.raises(ValueError):
        http_gate.ReadGate(0.5, limit=0)


def test_a_read_cancelled_while_it_waits_for_its_turn_wedges_nothing():
    """A client that hangs up while its read waits (standing or not) leaves the turn to the next."""
    r = Rig(1.0)
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.run("p", r.work("a", cost=0.0, hold=hold)))
        await asyncio.sleep(0)
        gone = [asyncio.create_task(r.gate.run("s", r.work("s", cost=0.0), standing=True)),
                asyncio.create_task(r.gate.run("q", r.work("q", cost=0.0)))]
        after = asyncio.create_task(r.gate.run("b", r.work("b", cost=0.0)))
        await asyncio.sleep(0)
        for t in gone:
            t.cancel()
        await asyncio.sleep(0)
        hold.set()
        return await first, await after, await r.gate.run("s", r.work("s2", cost=0.0), standing=True)

    assert asyncio.run(go()) == ("a@1", "b@2", "s2@3") and r.gate.others_waiting() == 0


def test_standing_reads_polled_back_to_back_take_turns_with_the_others():
    """Two scrapers read standing keys back to back: a trace read that arrived first still runs
    after one standing read, not after all of them (standing and other reads take turns)."""
    r = Rig(1.0)
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.run(("profile", "json"), r.work("s0", cost=0.0, hold=hold), standing=True))
        await asyncio.sleep(0)
        trace = asyncio.create_task(r.gate.run(("trace", 8), r.work("trace", cost=0.0)))
        await asyncio.sleep(0)

        async def scraper(fmt: str):
            for i in range(20):
                await r.gate.run(("profile", fmt), r.work(f"{fmt}{i}", cost=0.0), standing=True)

        scrapers = [asyncio.create_task(scraper(f)) for f in ("text", "prometheus")]
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(first, trace, *scrapers)

    asyncio.run(go())
    assert r.runs.index("trace") <= 2, r.runs[:6]


def test_a_read_cancelled_just_after_it_was_handed_the_turn_hands_it_on():
    """Cancelled between being handed the turn and resuming: the next read still gets the turn."""
    gate = ReadGate(1.0)

    async def go():
        gate._loop = asyncio.get_running_loop()
        await gate._acquire(False)  # this task holds the turn
        b = asyncio.create_task(gate._acquire(False))
        c = asyncio.create_task(gate._acquire(True))
        await asyncio.sleep(0)  # both wait
        gate._release()  # handed to c (standing first)
        c.cancel()  # ... which is cancelled before it resumes
        await asyncio.wait_for(b, 5)  # liveness only: b gets the turn
        return gate._busy

    assert asyncio.run(go()) is True


def test_a_sharer_whose_reads_owner_hangs_up_gets_its_own_answer():
    """Two readers of one key wait; the first (whose run the second shares) hangs up before it starts.
    The second is no hang-up: it is answered by a run of its own, not cancelled."""
    r = Rig(1.0)
    hold = asyncio.Event()

    async def go():
        first = asyncio.create_task(r.gate.run("p", r.work("a", cost=0.0, hold=hold)))
        await asyncio.sleep(0)
        owner = asyncio.create_task(r.gate.run("q", r.work("owner", cost=0.0)))
        await asyncio.sleep(0)
        sharer = asyncio.create_task(r.gate.run("q", r.work("sharer", cost=0.0)))
        await asyncio.sleep(0)
        owner.cancel()
        await asyncio.sleep(0)
        hold.set()
        await first
        return await asyncio.wait_for(sharer, 5), owner.cancelled()

    assert asyncio.run(go()) == ("sharer@2", True) and "owner" not in r.runs
