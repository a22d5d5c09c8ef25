"""views/http_context: every route module reads through the one context its install made (no module
global holds a client or the plain reference), and ``uninstall_routes`` removes exactly what
``install_routes`` added, on real FastAPI apps with a recording control client."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model import names
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import http, http_gate, http_guard
from sglang_ctxprof.views.profile import build_profile

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


class Recorder:
    """A control client that notes each command and answers with its own name."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []

    async def ask(self, cmd: str, **args):
        self.calls.append(cmd)
        return [{"status": {"rank": 0, "client": self.name}}]


def _plain_profile() -> dict:
    agg = Aggregator()
    for i in range(12):
        ctx = 100 + 400 * (i % 3)
        ph = {"decode": 5.0 + ctx / 1e3, "decode_attn": ctx / 1e3, "decode_moe": 3.0, "decode_rest": 2.0}
        agg.observe(StepRecord(step_id=i, kind="decode", algorithm=names.ALGORITHM_NONE, rank=RankId(),
                               rids=("r",), ctx_lens=(ctx,), accepted=(1,), committed=(1,), finished=(False,),
                               draft_tokens=0, step_ms=5.5 + ctx / 1e3, phases_ms=ph, t_start_ns=i * 10**7))
    return build_profile(agg.snapshot()).to_dict()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    monkeypatch.setattr(http_gate, "_GATE", http_gate.ReadGate(1.0))


def _app(client: Recorder):
    app = fastapi.FastAPI()
    http.install_routes(app, client, admin=lambda f: f)
    return app


def test_two_apps_each_read_through_their_own_client_and_plain_reference():
    one, two = Recorder("one"), Recorder("two")
    a, b = TestClient(_app(one)), TestClient(_app(two))
    assert a.get(names.ROUTE_STATUS).json()["ranks"][0]["status"]["client"] == "one"
    assert b.get(names.ROUTE_STATUS).json()["ranks"][0]["status"]["client"] == "two"
    assert a.get(names.ROUTE_TRACE_JSON + "?rid=abc").status_code == 404  # http_trace asked its app's client
    assert a.get(names.ROUTE_CAPTURE + "/c1").status_code == 404  # and so did http_capture
    assert one.calls == [names.CMD_STATUS, names.CMD_REQUESTS, names.CMD_CAPTURE]
    assert two.calls == [names.CMD_STATUS]
    r = a.post(names.ROUTE_PLAIN + "?source=arm", json=_plain_profile())
    assert r.status_code == 200, r.text
    assert a.get(names.ROUTE_PLAIN).json()["registered"] is True
    assert b.get(names.ROUTE_PLAIN).json()["registered"] is False  # app two keeps its own reference


def test_uninstall_mirrors_install_and_a_new_install_reads_through_the_new_client():
    app = fastapi.FastAPI()

    @app.get("/mine")
    def mine():
        return {"ok": True}

    before = [(getattr(r, "path", None), tuple(sorted(getattr(r, "methods", ()) or ()))) for r in app.router.routes]
    old = Recorder("old")
    rc = http.install_routes(app, old, admin=lambda f: f)
    assert rc.client is old and rc.gate is http_gate.gate()
    added = len(app.router.routes) - len(before)
    assert added >= 15 and any(getattr(r, "path", None) == names.ROUTE_TRACE_JSON for r in app.router.routes)
    http.uninstall_routes(app)
    after = [(getattr(r, "path", None), tuple(sorted(getattr(r, "methods", ()) or ()))) for r in app.router.routes]
    assert after == before
    http.uninstall_routes(app)  # twice: nothing more to remove
    assert len(app.router.routes) == len(before)
    new = Recorder("new")
    http.install_routes(app, old, admin=lambda f: f)
    http.install_routes(app, new, admin=lambda f: f)  # installing again replaces, never duplicates
    assert len(app.router.routes) == len(before) + added
    c = TestClient(app)
    assert c.get(names.ROUTE_STATUS).json()["ranks"][0]["status"]["client"] == "new"
    assert c.get("/mine").json() == {"ok": True}
    assert old.calls == []


def test_the_test_only_fault_switch_reads_through_the_context_outside_the_guard(monkeypatch):
    from sglang_ctxprof.model.guard import FAULT_RUNTIME

    monkeypatch.setattr(http_guard, "_GUARD", Guard(FAULT_RUNTIME))
    rec, wrapped = Recorder("faulty"), []
    app = fastapi.FastAPI()
    http.install_routes(app, rec, admin=lambda f: wrapped.append(f) or f)
    c = TestClient(app)
    r = c.post(names.ROUTE_FAULT, json={"component": "http"})
    assert r.status_code == 200 and r.json()["ranks"] == [{"rank": 0, "client": "faulty"}]
    assert rec.calls == [names.CMD_FAULT]
    assert c.get(names.ROUTE_STATUS).status_code == 503  # the http component is broken now
    assert c.post(names.ROUTE_FAULT, json={"component": ""}).status_code == 200  # the switch is not guarded
    assert c.get(names.ROUTE_STATUS).status_code == 200
    assert c.post(names.ROUTE_FAULT, json={"component": "nope"}).status_code == 400
    assert any(getattr(getattr(f, "__wrapped__", None), "func", None) is http.post_fault for f in wrapped)  # admin


class StateRank:
    """One scheduler answering ``snapshot`` as ``Profiler.state`` does: ``unchanged`` for a version
    the reader names, else the state with its version; ``version`` moves when ``bump`` is called."""

    def __init__(self, pid: int) -> None:
        self.pid, self.n, self.asked = pid, 0, []

    def answer(self, known) -> dict:
        v = f"{self.pid}.{self.n}"
        st = {"pid": self.pid, "submitted": self.n}
        if v in known:
            return {"status": st, "unchanged": v}
        return {"status": st, "state": {"records": self.n, "who": self.pid}, "version": v}


class States:
    def __init__(self, *ranks: StateRank) -> None:
        self.ranks, self.calls = ranks, []

    async def ask(self, cmd: str, **args):
        self.calls.append(args.get("known"))
        return [r.answer(args.get("known") or []) for r in self.ranks]


def test_unchanged_states_come_back_whole_and_a_version_not_held_is_asked_for_again():
    import asyncio

    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views.http_context import ReadContext

    a, b = StateRank(11), StateRank(12)
    client = States(a, b)
    rc = ReadContext(client, http_gate.ReadGate(1.0), CtxProfConfig())
    first = asyncio.run(rc.snapshot())
    assert client.calls == [None] and [p["state"]["who"] for p in first] == [11, 12]
    b.n += 1  # rank 12 moved, rank 11 did not
    second = asyncio.run(rc.snapshot())
    assert sorted(client.calls[-1]) == ["11.0", "12.0"]
    assert [p["state"] for p in second] == [{"records": 0, "who": 11}, {"records": 1, "who": 12}]
    assert all("unchanged" not in p for p in second) and second[0]["state"] is first[0]["state"]
    other = ReadContext(client, http_gate.ReadGate(1.0), CtxProfConfig())  # holds nothing yet
    client.calls.clear()
    rc.states._by_pid[11] = ("11.stale", {})  # a version the rank no longer has: it sends the state
    assert [p["state"]["who"] for p in asyncio.run(other.snapshot())] == [11, 12] and client.calls == [None]
    # Two reads on the loop at once: while one waits for the ranks, the other stores a newer state of
    # rank 12, so the first one's "unchanged" names a version no longer held: it asks again, naming none.
    racer = ReadContext(client, http_gate.ReadGate(1.0), CtxProfConfig())
    asyncio.run(racer.snapshot())
    real_ask = client.ask

    async def ask_while_another_read_lands(cmd, **args):
        racer.states._by_pid[12] = ("12.9", {"records": 9, "who": 12})
        client.ask = real_ask
        return await real_ask(cmd, **args)

    client.ask = ask_while_another_read_lands
    client.calls.clear()
    out = asyncio.run(racer.snapshot())
    assert [p["state"]["who"] for p in out] == [11, 12] and client.calls[0] and client.calls[-1] is None


class _FullGate(http_gate.ReadGate):
    """A gate whose queue of distinct reads is always full: a standing read is admitted (as the real
    gate admits it), any other refused."""

    async def run(self, key, work, standing=False):
        if standing:
            return await work()
        raise http_gate.GateFull(self.limit, 2.5)


@pytest.mark.parametrize("path", [names.ROUTE_DIAGNOSIS + "?ctx=7", names.ROUTE_REQUESTS + "?slowest=3",
                                  names.ROUTE_REQUESTS + "?slowest=20&steps=1", names.ROUTE_TRACE_JSON + "?last=2",
                                  names.ROUTE_REQUESTS + "/r1", names.ROUTE_REQUESTS + "?rid=r1",
                                  names.ROUTE_TRACE_JSON + "?rid=r1"])
def test_a_full_read_gate_is_a_429_json_error_on_every_gated_route(monkeypatch, path):
    """Every read that builds on the schedulers or the build thread waits its turn at the gate: one
    request's rows (thousands of steps: tens of ms on the scheduler, a MB to serialize) too."""
    monkeypatch.setattr(http_gate, "_GATE", _FullGate(1.0))
    rec = Recorder("one")
    r = TestClient(_app(rec), raise_server_exceptions=False).get(path)
    assert r.status_code == 429, r.text
    assert "reads are waiting" in r.json()["error"] and r.json()["retry_after_s"] == 2.5
    assert r.headers["Retry-After"] == "3" and rec.calls == [] and http_guard.guard().ok("http")


@pytest.mark.parametrize("path", [names.ROUTE, names.ROUTE + "?format=text", names.ROUTE + "?format=prometheus",
                                  names.ROUTE_DIAGNOSIS, names.ROUTE_DIAGNOSIS + "?format=text",
                                  names.ROUTE_REQUESTS, names.ROUTE_REQUESTS + "?slowest=20"])
def test_the_standing_reads_are_served_by_a_full_gate(monkeypatch, path):
    """A dashboard's, a scraper's and the live page's reads (standing) are never refused: each asks
    the ranks (this fake answers no state, so a profile read is a 503 here)."""
    monkeypatch.setattr(http_gate, "_GATE", _FullGate(1.0))
    rec = Recorder("one")
    r = TestClient(_app(rec), raise_server_exceptions=False).get(path)
    assert r.status_code != 429 and rec.calls, (path, r.status_code, r.text[:300])


def test_the_live_page_reads_the_standing_number_of_slowest_requests():
    from sglang_ctxprof.views import ui

    js = (Path(ui.__file__).resolve().parents[1] / "data" / "ui" / "app.js").read_text()
    assert f"const SLOWEST = {http.PAGE_SLOWEST};" in js


def test_the_id_a_route_shows_for_a_long_rid_is_found_when_looked_up():
    """A rid over ``RID_KEEP`` characters is shown as ``prefix..digest``; each lookup asks the ranks for
    that same id, not for a shortening of it."""
    from sglang_ctxprof.model.rids import short_rid

    shown = short_rid("L" * 300)
    asked = []

    class Ranks:
        async def ask(self, cmd: str, **args):
            asked.append((cmd, args.get("rid")))
            if cmd == names.CMD_REQUESTS and args.get("rid") == shown:
                return [{"requests": [{"rid": shown, "steps": 0, "step_rows": []}]}]
            return [{"accepted": True, "capture": {"id": "c"}}]

    c = TestClient(_app(Ranks()), raise_server_exceptions=False)
    r = c.get(f"{names.ROUTE_REQUESTS}/{shown}")
    assert r.status_code == 200 and r.json()["rid"] == shown, r.text
    assert c.get(f"{names.ROUTE_TRACE_JSON}?rid={shown}").status_code == 200
    assert c.post(f"{names.ROUTE_CAPTURE}?rid={shown}").status_code == 200
    assert [rid for _, rid in asked] == [shown] * 3


def test_the_schedulers_time_on_a_read_counts_toward_the_gates_cool_down():
    """A rank's answer says how long its scheduler thread spent on it; the longest (the ranks run at
    once) adds to what the read gate meters, so the next read waits in proportion to it too."""
    import asyncio

    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import http_build
    from sglang_ctxprof.views.http_context import ReadContext

    class Ranks:
        async def ask(self, cmd: str, **args):
            return [{names.PAYLOAD_SCHED_S: 0.25}, {names.PAYLOAD_SCHED_S: 0.5}, {"error": "x"}]

    rc = ReadContext(Ranks(), http_gate.ReadGate(1.0), CtxProfConfig())
    before = http_build.busy_s()
    asyncio.run(rc.ask(names.CMD_STATUS))
    assert http_build.busy_s() - before == pytest.approx(0.5)
