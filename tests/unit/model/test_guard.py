"""Units: the request log's global row budget, the fault guard's runtime switch, and the HTTP
guard turning a failure of ours into a JSON 500 (then 503) while other routes keep working."""

from __future__ import annotations

import random

import logging

import pytest
from starlette.requests import Request

from sglang_ctxprof.model.records import RankId, StepRecord, step_end_ns
from sglang_ctxprof.aggregate.requests import RequestLog
from sglang_ctxprof.model.guard import Guard, InjectedFault


def rec(step: int, rids: list[str], ctx: int = 100) -> StepRecord:
    n = len(rids)
    return StepRecord(step, "decode", "EAGLE", RankId(), tuple(rids), (ctx,) * n, (3,) * n, (3,) * n,
                      (False,) * n, 4, 5.0, {"draft": 1.0, "verify": 3.0, "overhead": 1.0}, step * 10, "cpu")


def test_row_budget_is_global_and_exact():
    log = RequestLog(capacity=50, max_steps=1000, max_rows=100)
    for step in range(200):
        log.observe(rec(step, [f"r{step // 20}", f"s{step // 20}"]))
    kept = sum(len(r["step_rows"]) for r in log._reqs.values())
    assert kept == log.rows <= 100
    totals = {r["rid"]: r for r in log.totals()}
    for r in totals.values():  # totals survive; dropped rows are counted
        assert r["steps"] == 20 and r["committed"] == 60
        assert len(log.get(r["rid"])["step_rows"]) + r["step_rows_dropped"] == 20
    newest = log.get("r9")
    assert newest["step_rows"][0] == {"step_id": 180, "t_start_ns": 1800, "ctx_len": 100, "batch_size": 2,
                                      "draft_tokens": 4, "accepted": 3, "committed": 3, "step_ms": 5.0,
                                      "block_size": 0, "denoise_steps": 0, "t_end_ns": 1800 + 5_000_000,
                                      "phases_ms": {"draft": 1.0, "verify": 3.0, "overhead": 1.0}}


def test_capacity_eviction_releases_rows():
    log = RequestLog(capacity=3, max_steps=10, max_rows=1000)
    for i in range(10):
        log.observe(rec(i, [f"r{i}"]))
    assert len(log) == 3 and log.evicted == 7 and log.rows == 3
    log.clear()
    assert log.rows == 0 and not log._with_rows


def test_fault_switch_needs_runtime_mode():
    with pytest.raises(PermissionError):
        Guard("").set_fault("hooks")
    g = Guard("runtime")
    with pytest.raises(ValueError):
        g.set_fault("nope")
    g.set_fault("recorder")
    assert not g.ok("recorder")  # the plan is checked at the component's own ok()
    assert "InjectedFault" in g.status()["components"]["recorder"]
    assert g.ok("hooks")  # other components are untouched
    calls = []
    assert g.run("recorder", calls.append, 1) is None and calls == []


def test_no_fault_plan_means_the_plain_check():
    """Without SGLANG_CTXPROF_FAULT at start, ok() is the class's plain membership test."""
    g = Guard("")
    assert "ok" not in vars(g) and g.ok("hooks")
    g = Guard("hooks")
    assert "ok" in vars(g) and not g.ok("hooks") and g.ok("recorder")
    assert InjectedFault.__name__ in g.status()["components"]["hooks"]


def test_guard_logs_once_and_heals(caplog):
    g = Guard("runtime")
    g.set_fault("aggregator")
    with caplog.at_level(logging.WARNING, logger="sglang_ctxprof.model.guard"):
        for _ in range(50):
            g.run("aggregator", lambda: None)
    warnings = [r for r in caplog.records if "failed and is now disabled" in r.getMessage()]
    assert len(warnings) == 1 and "Traceback" in warnings[0].getMessage()
    assert "InjectedFault" in g.status()["components"]["aggregator"]
    g.set_fault("")
    assert g.status() is None and g.ok("aggregator")


def test_http_guard_returns_json_500_and_only_repeated_failures_switch_off(monkeypatch):
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from sglang_ctxprof.views import http_guard

    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    broken_now = [True]

    async def flaky(request: Request):
        if broken_now[0]:
            raise KeyError("bug of ours")
        return {"ok": True}

    async def fine(request: Request):
        return {"ok": True}

    app = fastapi.FastAPI()
    app.add_api_route("/flaky", http_guard.guarded(flaky), methods=["GET"])
    app.add_api_route("/other", fine, methods=["GET"])
    c = TestClient(app)
    for _ in range(http_guard.STRIKES - 1):  # a failure, then a success: the count starts again
        r = c.get("/flaky")
        assert r.status_code == 500 and "KeyError" in r.json()["error"]
        assert "KeyError" in r.json()["degraded"][0]["components"]["http"]
    broken_now[0] = False
    assert c.get("/flaky").json() == {"ok": True}
    broken_now[0] = True
    for _ in range(http_guard.STRIKES):
        assert c.get("/flaky").status_code == 500
    r = c.get("/flaky")
    assert r.status_code == 503 and r.json()["degraded"]
    assert c.get("/other").json() == {"ok": True}  # the rest of the app is unaffected


@pytest.mark.parametrize("seed", range(6))
def test_totals_folded_from_rows_equal_a_step_by_step_fold(seed):
    """Rows appended per step, totals summed when read: the same totals as folding every step,
    also across truncation (max_steps), row shedding (max_rows), prefill records and reused rids."""
    rng = random.Random(seed)
    log = RequestLog(capacity=64, max_steps=rng.choice([0, 3, 50]), max_rows=rng.choice([5, 40, 10**6]))
    ref: dict[str, dict] = {}
    t = 0
    for step in range(300):
        rids = sorted(rng.sample([f"q{i}" for i in range(12)], rng.randint(1, 6)))
        kind = "prefill" if rng.random() < 0.1 else "decode"
        n = len(rids)
        ctx, acc = tuple(rng.randint(10, 5000) for _ in rids), tuple(rng.randint(1, 4) for _ in rids)
        com = tuple(rng.randint(0, a) for a in acc)
        fin = tuple(rng.random() < 0.05 for _ in rids)
        ms = rng.uniform(0.1, 30.0)
        t += 10**7
        r = StepRecord(step, kind, "EAGLE", RankId(), tuple(rids), ctx, acc if kind == "decode" else (0,) * n,
                       com if kind == "decode" else (0,) * n, fin, 4, ms, {"verify": ms}, t, "cpu")
        log.observe(r)
        for i, rid in enumerate(rids):
            uses = ref.setdefault(rid, [])
            if not uses or (kind != "decode" and uses[-1]["finished"]):  # a finished rid used again
                uses.append(dict(steps=0, accepted=0, committed=0, decode_ms=0.0, max_step_ms=0.0,
                                 ctx_first=None, ctx_last=None, finished=False, prefill_ms=0.0, t_end_ns=t))
            e = uses[-1]
            e["t_end_ns"] = step_end_ns(t, ms)  # the one definition of a step's end
            e["finished"] = e["finished"] or fin[i]
            if kind != "decode":
                e["prefill_ms"] += ms
                continue
            e["steps"] += 1
            e["accepted"] += acc[i]
            e["committed"] += com[i]
            e["decode_ms"] += ms
            e["max_step_ms"] = max(e["max_step_ms"], ms)
            e["ctx_first"] = ctx[i] if e["ctx_first"] is None else e["ctx_first"]
            e["ctx_last"] = ctx[i]
    assert log.rows <= log.max_rows and log.rows == sum(len(r["step_rows"]) for r in log.to_state(True))
    for got in log.to_state(with_steps=True):
        want = ref[got["rid"]][got["use"]]
        assert {k: got[k] for k in want if k != "decode_ms"} == {k: v for k, v in want.items() if k != "decode_ms"}
        assert got["decode_ms"] == pytest.approx(want["decode_ms"], rel=1e-12)
        kept = len(got["step_rows"])
        assert kept + got["step_rows_dropped"] + got["steps_truncated"] == got["steps"]


def test_listeners_hear_each_failure_and_the_heal_and_never_raise(caplog):
    g, heard = Guard(), []
    g.listen(lambda: heard.append(sorted((g.status() or {}).get("components", {}))))
    g.listen(lambda: 1 / 0)  # a broken listener: logged, the failing path goes on
    with caplog.at_level(logging.WARNING, logger="sglang_ctxprof.model.guard"):
        g.fail("metrics", RuntimeError("x"))
        g.fail("metrics", RuntimeError("again"))  # already off: nothing new to tell
        g.clear()
    assert heard == [["metrics"], []]
    assert sum("fault listener failed" in r.getMessage() for r in caplog.records) == 2
