"""``views.http_plain``: the live server's plain reference and the ledger it puts into
``/ctx_profile/diagnosis``, on the real routes (FastAPI TestClient) over a real Aggregator's state.

The schedulers' control channel is replaced by a fake answering ``snapshot`` with the state of an
Aggregator fed StepRecords, the same payload shape the real ranks send (``state`` + ``status``).
The real-server proof is tests/server/test_spec_vs_plain.py.
"""

from __future__ import annotations

import json

import pytest

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model import names
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import http, http_guard, http_plain
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile
from sglang_ctxprof.views.profile import build_profile

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

CTXS = (100, 1500, 3000)


def _agg(spec: bool) -> Aggregator:
    agg = Aggregator()
    for i in range(30):
        ctx = CTXS[i % 3] + i
        if spec:
            attn = 1.0 + 0.8 * ctx / 1e3
            ph = {"draft": 2.0, "verify": attn + 6.0, "verify_attn": attn, "verify_moe": 4.0, "verify_rest": 2.0,
                  "draft_extend": 1.0, "overhead": 0.5}
            step, acc, alg, dt = 2.0 + attn + 6.0 + 1.0 + 0.5, 3, "EAGLE", 3
        else:
            attn = 0.6 + 0.4 * ctx / 1e3
            ph = {"decode": attn + 5.0, "decode_attn": attn, "decode_moe": 3.5, "decode_rest": 1.5, "overhead": 0.4}
            step, acc, alg, dt = attn + 5.4, 1, names.ALGORITHM_NONE, 0
        agg.observe(StepRecord(step_id=i, kind="decode", algorithm=alg, rank=RankId(), rids=(f"r{i % 3}",),
                               ctx_lens=(ctx,), accepted=(acc,), committed=(acc,), finished=(False,),
                               draft_tokens=dt, step_ms=step, phases_ms=ph, t_start_ns=i * 20_000_000))
    return agg


class FakeChannel:
    """The control client's one method the read routes use: every rank's answer to a command."""

    def __init__(self, agg: Aggregator):
        self.agg = agg

    async def ask(self, cmd: str, **args):
        assert cmd == names.CMD_SNAPSHOT, cmd
        return [{"state": self.agg.snapshot().to_dict(), "status": {"enabled": True, "dropped": 0}}]


@pytest.fixture()
def client(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    app = fastapi.FastAPI()
    http.install_routes(app, FakeChannel(_agg(spec=True)), admin=lambda f: f)
    return TestClient(app)


def _plain_body() -> dict:
    return build_profile(_agg(spec=False).snapshot()).to_dict(envelope=False)


def test_without_a_reference_the_ledger_says_why_and_holds_no_number(client):
    d = client.get(names.ROUTE_DIAGNOSIS).json()
    assert d["ledger"] == {"available": False, "reason": http_plain.reason(
        build_profile(_agg(spec=True).snapshot()))}
    assert d["ledger"]["reason"].startswith("no plain-decode reference registered") and "/ctx_profile/plain" in \
        d["ledger"]["reason"]
    assert client.get(names.ROUTE_PLAIN).json() == {"schema_version": names.SCHEMA_VERSION, "registered": False}


def test_a_registered_plain_profile_puts_the_ledger_in_the_diagnosis(client):
    body = _plain_body()
    r = client.post(names.ROUTE_PLAIN + "?source=plain-a", content=json.dumps(body))
    assert r.status_code == 200, r.text
    reg = r.json()
    assert reg["registered"] and reg["source"] == "plain-a" and reg["steps"] == 30
    assert reg["buckets"] == [b["label"] for b in body["buckets"] if b["steps"]]
    d = client.get(names.ROUTE_DIAGNOSIS).json()
    led = d["ledger"]
    # the JSON shape the page and scripts read
    assert set(led) == {"available", "rows", "attention", "moe", "crossover", "verdict", "measured", "plain_source"}
    assert led["available"] and led["plain_source"] == "plain reference: plain-a"
    row_keys = {"ctx", "label", "al", "step_ms", "plain_step_ms", "plain_from", "speedup", "saved_ms", "spent_ms",
                "net_ms", "net_per_token_ms", "verify_attn_ms", "decode_attn_ms", "verify_inflation",
                "verify_moe_ms", "decode_moe_ms", "moe_inflation"}
    assert all(set(r) == row_keys for r in led["rows"])
    assert all(set(r["spent_ms"]) == {"draft", "draft_extend", "verify_extra", "overhead_extra"} for r in led["rows"])
    assert set(led["crossover"]) >= {"ctx", "how", "note"}
    # the same numbers as diagnosing both profiles offline (diagnose --plain)
    spec_prof = build_profile(_agg(spec=True).snapshot())
    from sglang_ctxprof.views.profile import Profile

    off = diagnose(evidence_from_profile(spec_prof, source="server"),
                   plain=evidence_from_profile(Profile.from_dict(body), source="plain reference: plain-a"))["ledger"]
    assert [r["label"] for r in led["rows"]] == [r["label"] for r in off["rows"]] == ["64-127", "1024-2047",
                                                                                        "2048-4095"]
    for a, b in zip(led["rows"], off["rows"]):
        assert a["speedup"] == pytest.approx(b["speedup"], rel=1e-12)
        assert a["plain_from"] == "measured"  # the plain arm's own bucket, not an interpolation
        assert a["speedup"] == pytest.approx(a["al"] * a["plain_step_ms"] / a["step_ms"])
        assert a["saved_ms"] - sum(a["spent_ms"].values()) == pytest.approx(a["net_ms"])
    assert led["attention"]["scales_worse"] and "the verify attention path scales worse" in led["verdict"]
    assert led["verdict"] in d["headline"]
    assert all("plain step at this context" in x["measured"] for x in d["whatif"]["draft_budget"])
    text = client.get(names.ROUTE_DIAGNOSIS + "?format=text").text
    assert "speculation ledger (per spec step" in text and "plain reference: plain-a" in text


@pytest.mark.parametrize("body,why", [
    (b"not json", "body must be a /ctx_profile JSON body"),
    (b"[1, 2]", "with \"buckets\""),
    (b'{"buckets": [{"label": 3}]}', "not a ctx profile body"),
    (b'{"buckets": []}', "holds no decode step"),
])
def test_bad_registrations_get_a_400_and_lose_nothing(client, body, why):
    assert client.post(names.ROUTE_PLAIN, content=json.dumps(_plain_body())).status_code == 200
    r = client.post(names.ROUTE_PLAIN, content=body)
    assert r.status_code == 400 and why in r.json()["error"], r.text
    assert client.get(names.ROUTE_PLAIN).json()["registered"]  # the earlier reference is kept
    assert client.get(names.ROUTE_DIAGNOSIS).json()["ledger"]["available"]


def test_a_speculative_profile_is_not_a_plain_reference_and_delete_forgets(client):
    spec = build_profile(_agg(spec=True).snapshot()).to_dict(envelope=False)
    r = client.post(names.ROUTE_PLAIN, content=json.dumps(spec))
    assert r.status_code == 400 and "speculative steps (EAGLE)" in r.json()["error"]
    assert client.post(names.ROUTE_PLAIN + "?sauce=x", content=b"{}").status_code == 400
    assert client.post(names.ROUTE_PLAIN + "?source=" + "x" * 201, content=b"{}").status_code == 400
    assert client.post(names.ROUTE_PLAIN, content=json.dumps(_plain_body())).status_code == 200
    assert client.delete(names.ROUTE_PLAIN).json() == {"ok": True, "removed": True}
    assert client.delete(names.ROUTE_PLAIN).json() == {"ok": True, "removed": False}
    assert client.get(names.ROUTE_DIAGNOSIS).json()["ledger"]["available"] is False


def test_a_plain_server_says_it_has_no_ledger_of_its_own(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    app = fastapi.FastAPI()
    http.install_routes(app, FakeChannel(_agg(spec=False)), admin=lambda f: f)
    led = TestClient(app).get(names.ROUTE_DIAGNOSIS).json()["ledger"]
    assert led["available"] is False and led["reason"].startswith("this server decodes without speculation")


def test_an_empty_speculative_profile_is_not_called_a_plain_server():
    """Right after a reset a speculative server has no step: the ledger waits for steps; it does not
    say the server decodes without speculation."""
    from sglang_ctxprof.views.profile import Profile

    body = build_profile(Aggregator().snapshot()).to_dict()
    body["ranks"] = [{"algorithm": "EAGLE"}]
    why = http_plain.reason(Profile.from_dict(body))
    assert "without speculation" not in why and why.startswith("no decode step recorded yet")


def test_a_thin_reference_bucket_is_left_out_of_the_live_ledger_as_offline(client):
    """The live ledger reads the reference as ``diagnose --plain`` does: a bucket of too few steps is
    compared nowhere when solid ones exist."""
    from sglang_ctxprof.views.profile import Profile

    plain_agg = Aggregator()  # 10 steps at 100 and 1500 tokens, 2 (thin) and far slower at 3000
    for i, ctx in enumerate([100] * 10 + [1500] * 10 + [3000] * 2):
        plain_agg.observe(StepRecord(step_id=i, kind="decode", algorithm=names.ALGORITHM_NONE, rank=RankId(),
                                     rids=("t",), ctx_lens=(ctx + i,), accepted=(1,), committed=(1,),
                                     finished=(False,), draft_tokens=0, step_ms=6.0 + (30.0 if ctx == 3000 else 0.0),
                                     phases_ms={"decode": 5.6, "overhead": 0.4}, t_start_ns=i * 20_000_000))
    body = build_profile(plain_agg.snapshot()).to_dict(envelope=False)
    assert client.post(names.ROUTE_PLAIN, content=json.dumps(body)).status_code == 200
    live = client.get(names.ROUTE_DIAGNOSIS).json()["ledger"]
    spec_prof = build_profile(_agg(spec=True).snapshot())
    off = diagnose(evidence_from_profile(spec_prof, source="server"),
                   plain=evidence_from_profile(Profile.from_dict(body), source="x"))["ledger"]
    assert [(r["label"], r["plain_from"]) for r in live["rows"]] == [(r["label"], r["plain_from"]) for r in off["rows"]]
    for a, b in zip(live["rows"], off["rows"]):
        assert a["plain_step_ms"] == pytest.approx(b["plain_step_ms"], rel=1e-12)


def test_the_page_draws_the_ledger_from_these_fields_only(client):
    """Every field the page's ledger renderer reads is in the route's JSON, and it recomputes none."""
    import re

    from sglang_ctxprof.views import ui

    assert client.post(names.ROUTE_PLAIN, content=json.dumps(_plain_body())).status_code == 200
    led = client.get(names.ROUTE_DIAGNOSIS).json()["ledger"]
    js = ui.read("app.js").decode()
    start = js.index("function ledgerRows(")
    part = js[start:js.index("// ----", start)]  # the ledger renderer, up to the next section
    row_fields = set(re.findall(r"\br\.(\w+)", part)) | set(re.findall(r"led\.rows\[i\]\.(\w+)", part))
    spent = set(re.findall(r"r\.spent_ms\.(\w+)", part))
    top = set(re.findall(r"\bled\.(\w+)", part)) - {"rows"} | {"rows"}
    assert row_fields and row_fields <= set(led["rows"][0]), row_fields - set(led["rows"][0])
    assert spent == set(led["rows"][0]["spent_ms"])  # every spent term is drawn
    assert top <= set(led) | {"reason"}, top - set(led)
    assert not re.search(r"\*|al\s*\*|/\s*r\.", part.replace("×", ""))  # no arithmetic on the numbers
    html = ui.read("index.html").decode()
    for el in ("ledger-box", "ledger-source", "ledger-verdict", "ledger", "ledger-notes"):
        assert f'id="{el}"' in html, el


def _broken_bodies():
    """Bodies that look like a plain profile and hold a field of the wrong type (each used to raise
    past the route's ValueError check: a 500, and three in a row switched every route off)."""
    for key, val in (("robust", "x"), ("robust.step_ms", [])):
        b = _plain_body()
        for bk in b["buckets"]:
            if "." in key:
                bk["robust"][key.split(".")[1]] = val
            else:
                bk[key] = val
        yield f"buckets[].{key}={val!r}", b
    b = _plain_body()
    b["acceptance_by_ctx"] = "x"
    yield "acceptance_by_ctx='x'", b
    # fields the ledger reads only against a speculative server's points (a check that diagnosed
    # the reference against itself never read them: accepted, then every /diagnosis failed)
    for val in ("x", [1], None, -3.0):
        b = _plain_body()
        b["host"] = {"between_steps": {"count": 1, "p50_ms": val}}
        yield f"host.between_steps.p50_ms={val!r}", b
    for val in ("nan", "inf", -5.0):
        b = _plain_body()
        for bk in b["buckets"]:
            for ph in bk["phases"].values():
                ph["p50_ms"] = ph["mean_ms"] = val
            bk.pop("robust", None)
        yield f"phases[].mean_ms={val!r}", b


@pytest.mark.parametrize("what, body", list(_broken_bodies()))
def test_a_malformed_plain_body_is_a_400_and_switches_nothing_off(client, what, body):
    for _ in range(http_guard.STRIKES + 1):
        r = client.post(names.ROUTE_PLAIN, content=json.dumps(body))
        assert r.status_code == 400, (what, r.status_code, r.text[:300])
        assert "not a usable /ctx_profile body" in r.json()["error"], r.text
    assert client.get(names.ROUTE_PLAIN).json()["registered"] is False
    for _ in range(http_guard.STRIKES + 1):
        assert client.get(names.ROUTE_DIAGNOSIS).status_code == 200
    assert http_guard.guard().ok("http")


def test_a_plain_body_past_the_parser_or_with_nan_is_a_400(client):
    for data in (b"[" * 100_000, b'{"buckets": [], "x": NaN}'):
        for _ in range(http_guard.STRIKES + 1):
            r = client.post(names.ROUTE_PLAIN, content=data)
            assert r.status_code == 400, (data[:20], r.status_code, r.text[:200])
    assert client.get(names.ROUTE_DIAGNOSIS).status_code == 200


def test_a_number_past_the_largest_float_or_a_control_character_in_the_source_is_a_400(client):
    data = json.dumps(_plain_body()).replace('"mean_ms": ', '"mean_ms": 1e999, "x": ', 1)
    for _ in range(http_guard.STRIKES + 1):
        r = client.post(names.ROUTE_PLAIN, content=data)
        assert r.status_code == 400 and "largest float" in r.json()["error"], r.text[:300]
        r = client.post(names.ROUTE_PLAIN + "?source=a%1b%5B2Jb", content=json.dumps(_plain_body()))
        assert r.status_code == 400 and "printable" in r.json()["error"], r.text[:300]
    assert client.get(names.ROUTE_PLAIN).json()["registered"] is False and http_guard.guard().ok("http")


def test_a_plain_body_of_too_many_buckets_is_a_400(client, monkeypatch):
    monkeypatch.setattr(http_plain, "MAX_BUCKETS", 2)
    r = client.post(names.ROUTE_PLAIN, content=json.dumps(_plain_body()))
    assert r.status_code == 400 and "at most 2" in r.json()["error"], r.text


def test_a_reference_whose_extrapolation_would_overflow_is_refused_or_read_without_a_failure(client):
    """Three buckets a twentieth of a token apart, one attention time of 1e151 ms: extrapolated to this
    server's contexts (hundreds to thousands of tokens), the ledger's fits overflowed (OverflowError:
    500s, then every route off).  A time past what a server measures is the body's 400; one within it
    extrapolates however far without a failure."""
    def body(attn_ms):
        b = _plain_body()
        for i, bk in enumerate(b["buckets"]):
            bk["label"], bk["ctx_sum"] = f"{i}+", 100.0 + 0.5 * (i % 2) + 0.25 * (i // 2)
            for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"):
                bk["phases"]["decode_attn"][k] = attn_ms if i == 1 else 0.0
            bk.pop("robust", None)
        return b

    r = client.post(names.ROUTE_PLAIN, content=json.dumps(body(1e151)))
    assert r.status_code == 400 and "decode_attn" in r.json()["error"], r.text[:300]
    assert client.post(names.ROUTE_PLAIN, content=json.dumps(body(http_plain.MAX_MS))).status_code == 200
    for _ in range(http_guard.STRIKES + 1):
        assert client.get(names.ROUTE_DIAGNOSIS).status_code == 200
    assert http_guard.guard().ok("http")


def test_reference_contexts_a_hair_apart_neither_overflow_nor_switch_anything_off(client):
    """Buckets of 10**300 request-steps put the contexts at 1e-300 tokens apart: their slope, followed
    to this server's contexts, overflowed the ledger's fits (500s, then every route off)."""
    b = _plain_body()
    for i, bk in enumerate(b["buckets"]):
        bk["label"], bk["ctx_sum"] = f"x{i}", i + 1
        bk.pop("mean_ctx", None)
        bk["req_steps"] = bk["accepted"] = bk["committed"] = 10**300
        for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"):
            bk["phases"]["decode_attn"][k] = (0.0, 1.0, 0.0)[i % 3]
        bk.pop("robust", None)
    r = client.post(names.ROUTE_PLAIN, content=json.dumps(b))
    assert r.status_code in (200, 400), r.text[:300]
    for _ in range(http_guard.STRIKES + 1):
        assert client.get(names.ROUTE_DIAGNOSIS).status_code == 200
    assert http_guard.guard().ok("http")


def test_two_reference_buckets_at_one_context_are_read_without_a_division_by_zero(client):
    b = _plain_body()
    b["buckets"] = b["buckets"][:1] * 2
    b["buckets"][1] = {**b["buckets"][1], "label": "copy"}
    assert client.post(names.ROUTE_PLAIN, content=json.dumps(b)).status_code == 200
    assert client.get(names.ROUTE_DIAGNOSIS).json()["ledger"]["available"] is True


def test_a_plain_body_over_the_cap_is_a_413(client, monkeypatch):
    monkeypatch.setattr(http_plain, "MAX_BODY", 1000)
    r = client.post(names.ROUTE_PLAIN, content=json.dumps(_plain_body()))
    assert r.status_code == 413, r.text
