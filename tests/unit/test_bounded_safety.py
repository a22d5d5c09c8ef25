"""Units: the request log's global row budget, the fault guard's runtime switch, and the HTTP
guard turning a failure of ours into a JSON 500 (then 503) while other routes keep working."""

from __future__ import annotations

import logging

import pytest
from starlette.requests import Request

from sglang_ctxprof.model.records import RankId, StepRecord
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
                                      "draft_tokens": 4, "accepted": 3, "committed": 3, "step_ms": 5.0, "t_end_ns": 1800 + 5_000_000,
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


def test_http_guard_returns_json_500_then_503(monkeypatch):
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from sglang_ctxprof.views import http as http_route

    monkeypatch.setattr(http_route, "_GUARD", Guard(""))

    async def broken(request: Request):
        raise KeyError("bug of ours")

    async def fine(request: Request):
        return {"ok": True}

    app = fastapi.FastAPI()
    app.add_api_route("/broken", http_route._guarded(broken), methods=["GET"])
    app.add_api_route("/other", fine, methods=["GET"])
    c = TestClient(app)
    r = c.get("/broken")
    assert r.status_code == 500 and "KeyError" in r.json()["error"]
    assert "KeyError" in r.json()["degraded"][0]["components"]["http"]
    r = c.get("/broken")
    assert r.status_code == 503 and r.json()["degraded"]
    assert c.get("/other").json() == {"ok": True}  # the rest of the app is unaffected
