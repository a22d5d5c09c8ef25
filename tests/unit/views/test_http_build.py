"""views/http_build: the read routes build profiles on one worker thread, never on the event loop
(which also runs SGLang's tokenizer manager), one build at a time, and a build is reused while the
ranks' versions (pid, submitted, records, hw) stay the same."""

from __future__ import annotations

import asyncio
import threading

import fastapi
import httpx
import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.snapshot import Snapshot, merge
from sglang_ctxprof.model import names
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import http, http_build, http_gate, http_guard
from sglang_ctxprof.views.profile import build_profile


def _rec(i: int, kind: str = "decode") -> StepRecord:
    ctx = 100 + 37 * i % 5000
    attn = 0.5 + ctx / 2000 + (i % 7) * 0.01
    ph = {"draft": 1.0, "verify": attn + 3.0, "verify_attn": attn, "verify_moe": 2.0, "verify_rest": 1.0,
          "draft_extend": 0.5, "overhead": 0.2}
    return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(f"r{i % 5}", f"q{i % 3}"),
                      ctx_lens=(ctx, ctx // 2 + 1), accepted=(2, 1), committed=(2, 1), finished=(False, False),
                      draft_tokens=3, step_ms=attn + 4.7, phases_ms=ph if kind == "decode" else {},
                      t_start_ns=10**18 + i * 20_000_000, timing="cpu")


def _agg(n: int = 300) -> Aggregator:
    agg = Aggregator()
    for i in range(n):
        agg.observe(_rec(i, "prefill" if i % 40 == 0 else "decode"))
    return agg


class Channel:
    """Every rank's answer to a snapshot, shaped like the real ones (``state`` + ``status``)."""

    def __init__(self, agg: Aggregator) -> None:
        self.agg, self.submitted = agg, agg.records

    async def ask(self, cmd: str, **args):
        if cmd == names.CMD_STATUS:
            return [{"status": {"enabled": True}}]
        assert cmd == names.CMD_SNAPSHOT, cmd
        return [{"state": self.agg.state(with_requests=False),
                 "status": {"enabled": True, "dropped": 0, "pid": 7, "submitted": self.submitted}}]

    def step(self, i: int) -> None:
        self.agg.observe(_rec(i))
        self.submitted += 1


@pytest.fixture()
def app(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    monkeypatch.setattr(http_build, "CACHE", http_build.BuildCache())
    monkeypatch.setattr(http, "CACHE", http_build.CACHE)
    monkeypatch.setattr(http_gate, "_GATE", http_gate.ReadGate(1.0))  # no cool-down: reads run back to back
    builds: list[str] = []
    real = http.build_profile

    def counting(snap, fits=None):
        builds.append(threading.current_thread().name)
        return real(snap, fits)

    monkeypatch.setattr(http, "build_profile", counting)
    ch = Channel(_agg())
    a = fastapi.FastAPI()
    http.install_routes(a, ch, admin=lambda f: f)
    a.state.builds, a.state.channel = builds, ch
    return a


def _get(app, *paths: str) -> list[httpx.Response]:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await asyncio.gather(*(c.get(p) for p in paths))

    return asyncio.run(go())


def test_profiles_are_built_on_the_build_thread_once_per_change_of_the_data(app):
    builds, ch = app.state.builds, app.state.channel
    r = _get(app, names.ROUTE, names.ROUTE_DIAGNOSIS, names.ROUTE + "?format=text")
    assert [x.status_code for x in r] == [200, 200, 200]
    assert builds and all(t.startswith("ctxprof-build") for t in builds), builds  # never the event loop
    assert len(builds) == 1  # one rank: one build, shared by the profile, the diagnosis and the text
    assert r[0].json()["totals"]["decode_steps"] > 0 and r[0].json()["ranks"][0]["profile"]["totals"]
    _get(app, names.ROUTE, names.ROUTE_DIAGNOSIS)
    assert len(builds) == 1  # the page's next refresh, nothing changed: served from the cache
    ch.step(10_000)
    body = _get(app, names.ROUTE)[0].json()
    assert len(builds) == 2 and body["totals"]["records"] == 301  # a new step: built again
    ch.agg.reset()  # a reset: records drop to 0, submitted stays
    body = _get(app, names.ROUTE)[0].json()
    assert len(builds) == 3 and body["totals"]["records"] == 0


def test_one_build_at_a_time_and_the_loop_answers_meanwhile(app, monkeypatch):
    ch = app.state.channel
    running, most, order = [0], [0], []
    release = threading.Event()
    real = http._built

    def slow(payloads, fits=None):
        running[0] += 1
        most[0] = max(most[0], running[0])
        release.wait(30)  # liveness only: on the loop this would block the status read below
        out = real(payloads, fits)
        running[0] -= 1
        order.append("built")
        return out

    monkeypatch.setattr(http, "_built", slow)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            reads = []
            for i in range(3):
                ch.step(20_000 + i)  # a new version each time: no cache hit
                reads.append(asyncio.create_task(c.get(names.ROUTE)))
                await asyncio.sleep(0.01)
            st = await c.get(names.ROUTE_STATUS)
            order.append("status")
            release.set()
            return st, await asyncio.gather(*reads)

    st, reads = asyncio.run(go())
    assert st.status_code == 200 and [r.status_code for r in reads] == [200, 200, 200]
    assert order[0] == "status" and most[0] == 1  # the loop was free; builds never overlapped


def test_one_rank_merged_is_that_rank():
    snap = Snapshot.from_dict(_agg(600).state(with_requests=False))
    assert build_profile(merge([snap])).to_dict() == build_profile(snap).to_dict()


def test_a_ranks_own_version_token_is_the_key_and_the_fields_only_stand_in_for_older_ranks():
    """The rank defines its version (``Profiler.state``: resets and what the state includes are in
    it); the fields (pid, submitted, records, device facts) key an answer only where it has none."""
    st, state = {"pid": 7, "submitted": 5}, {"records": 5}
    a = http_build.versions([{"status": st, "state": state, "version": "7.5.5.0.1.00"}])
    b = http_build.versions([{"status": st, "state": state, "version": "7.5.5.1.1.00"}])  # one reset later
    assert a == ("7.5.5.0.1.00",) and b == ("7.5.5.1.1.00",) and a != b
    assert http_build.versions([{"status": st, "state": state}]) == ((7, 5, 5, "None"),)


def test_answers_without_versions_are_never_cached():
    assert http_build.versions([{"error": "down"}]) is None
    assert http_build.versions([{"state": {"records": 1}, "status": {"enabled": True}}]) is None
    c = http_build.BuildCache(size=2)
    assert [c.get(None, lambda: 1), c.get(None, lambda: 2)] == [1, 2] and c.builds == 2
    assert [c.get("a", lambda: 1), c.get("a", lambda: 9), c.get("b", lambda: 2), c.get("c", lambda: 3),
            c.get("a", lambda: 4)] == [1, 1, 2, 3, 4]  # "a" fell out of the two kept


def test_reads_arriving_during_a_build_share_the_next_one_which_sees_their_data(app, monkeypatch):
    builds, ch = app.state.builds, app.state.channel
    release, started = threading.Event(), threading.Event()
    real = http._built

    def held(payloads, fits=None):
        started.set()
        release.wait(30)  # liveness only
        return real(payloads, fits)

    monkeypatch.setattr(http, "_built", held)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            first = asyncio.create_task(c.get(names.ROUTE))
            while not started.is_set():
                await asyncio.sleep(0.01)  # until the first read is building
            ch.step(30_000)  # a step lands after it asked: the later readers must see it
            later = [asyncio.create_task(c.get(names.ROUTE)) for _ in range(3)]
            for _ in range(3000):  # liveness only: until all three wait at the gate
                if http_gate._GATE.shared == 2:
                    break
                await asyncio.sleep(0.01)
            release.set()
            return await first, await asyncio.gather(*later)

    first, later = asyncio.run(go())
    assert first.json()["totals"]["records"] == 300
    assert [r.json()["totals"]["records"] for r in later] == [301] * 3
    assert len(builds) == 2  # three later readers, one build
    assert http_gate._GATE.shared == 2


def test_a_rebuild_reuses_the_fits_its_build_cache_remembers(monkeypatch):
    """The build cache owns the memo of recent Theil-Sen fits: a rebuild of the same samples (here
    forced by clearing the kept builds) refits nothing; a cache of its own starts with no fit."""
    from sglang_ctxprof.model import stats

    fitted: list[int] = []
    real = stats._theil_sen
    monkeypatch.setattr(stats, "_theil_sen", lambda p, m: fitted.append(len(p)) or real(p, m))
    monkeypatch.setattr(http, "CACHE", http_build.BuildCache())
    agg = _agg(600)
    payload = {"state": agg.state(with_requests=False), "status": {"enabled": True, "pid": 1, "submitted": agg.records}}
    first = http.served_profile([payload]).to_dict()
    n = len(fitted)
    assert n and len(http.CACHE.fits) == n
    http.CACHE.clear()  # the kept builds go; the fits stay
    assert http.served_profile([payload]).to_dict()["fits"] == first["fits"] and len(fitted) == n
    monkeypatch.setattr(http, "CACHE", http_build.BuildCache())
    http.served_profile([payload])
    assert len(fitted) == 2 * n


def test_ranks_far_apart_in_steps_merge_into_one_profile():
    """One data-parallel rank ran 3,000 steps, the other one: the read still answers."""
    busy, idle = Aggregator(), Aggregator()
    for i in range(3000):
        busy.observe(_rec(i))
    idle.observe(StepRecord(step_id=0, kind="decode", algorithm="EAGLE", rank=RankId(dp=1), rids=("t",),
                            ctx_lens=(50,), accepted=(3,), committed=(3,), finished=(False,), draft_tokens=4,
                            step_ms=10.0, t_start_ns=10**18, timing="cpu"))
    st = {"enabled": True, "submitted": 1}
    prof = http.served_profile([{"state": busy.state(), "status": dict(st, pid=1)},
                                {"state": idle.state(), "status": dict(st, pid=2)}])
    assert sum(b["steps"] for b in prof.to_dict()["buckets"]) == 3001


def test_the_prometheus_view_refuses_a_partial_merge():
    """A rank that missed the control timeout: the JSON says which, but Prometheus would read the
    smaller merged counters as a reset (``increase()`` then counts steps twice).  A failed scrape
    (no sample) is the honest answer there."""
    st = {"enabled": True, "submitted": 300}
    both = [{"state": _agg().state(), "status": dict(st, pid=1)}, {"state": _agg().state(), "status": dict(st, pid=2)}]
    one = [both[0], {"error": "rank 1: no answer within 30 s"}]
    assert http._profile_reply(both, "prometheus").status_code == 200
    assert http._profile_reply(one, "json").status_code == 200
    r = http._profile_reply(one, "prometheus")
    assert r.status_code == 503 and b"rank 1: no answer" in r.body
