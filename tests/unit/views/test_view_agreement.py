"""Every view states the same facts about the same records: acceptance by draft position and
accepted tokens per step in the JSON profile, the text table, the live Prometheus counters, the
``?format=prometheus`` exposition, the page's data and the trace export.

The records are the hard cases: UNO (two non-draft tokens per step), an adaptive budget (steps whose
budget stops short of the last positions), a batch of two with different own contexts, a request
whose accepted length is unknown (0) and a plain-decode record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import prometheus, text
from sglang_ctxprof.views.metrics import MetricsView
from sglang_ctxprof.views.profile import Profile, build_profile
from sglang_ctxprof.views.trace_events import request_trace, steps_trace

PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}


def _rec(i, alg, ctx, acc, draft_tokens, depth=0, nd=1):
    n = len(ctx)
    return StepRecord(step_id=i, kind="decode", algorithm=alg, rank=RankId(), rids=tuple(f"r{j}" for j in range(n)),
                      ctx_lens=tuple(ctx), accepted=tuple(acc), committed=tuple(max(0, a) for a in acc),
                      finished=(False,) * n, draft_tokens=draft_tokens, step_ms=6.5, phases_ms=PH,
                      t_start_ns=1_000_000 * (i + 1), non_draft_tokens=nd, draft_depth=depth)


def records():
    out = []
    i = 0
    # EAGLE chain of 3, adaptive: budget 3 on some steps, 1 on others (positions 2..3 unobserved there)
    for acc, depth in [((4, 1), 3), ((2, 3), 3), ((2, 2), 1), ((1, 2), 1), ((3, 0), 3)]:
        out.append(_rec(i, "EAGLE", (100, 3000), acc, 4, depth))
        i += 1
    # UNO: block of 4 behind a clean root: accepted counts the bonus and the root (nd = 2)
    for acc in [(2,), (5,), (3,), (4,)]:
        out.append(_rec(i, "UNO", (1500,), acc, 5, 0, nd=2))
        i += 1
    out.append(_rec(i, "NONE", (700,), (1,), 0))  # plain decode: no acceptance by position
    return out


@pytest.fixture(scope="module")
def views():
    bk = Bucketing.parse("pow2")
    agg = Aggregator(bk)
    reg = CollectorRegistry()
    live = MetricsView(bk, reg)
    for r in records():
        agg.observe(r)
        live.observe(r)
    prof = build_profile(agg.snapshot())
    body = prof.to_dict(envelope=False)
    return {"agg": agg, "profile": prof, "json": Profile.from_dict(body).to_dict(envelope=False),
            "text": text.render(prof), "live": generate_latest(reg).decode(),
            "prom": prometheus.render(prof)}


def _p_by_bucket(expo: str) -> dict[str, list[float]]:
    hit, seen = {}, {}
    for fam in text_string_to_metric_families(expo):
        for s in fam.samples:
            if s.name == "sglang_ctxprof_position_accepted_total":
                hit[(s.labels["ctx_bucket"], int(s.labels["position"]))] = s.value
            elif s.name == "sglang_ctxprof_position_observed_total":
                seen[(s.labels["ctx_bucket"], int(s.labels["position"]))] = s.value
    assert set(hit) == set(seen)
    out: dict[str, list[float]] = {}
    for (b, i) in sorted(seen, key=lambda k: (k[0], k[1])):
        out.setdefault(b, []).append(hit[(b, i)] / seen[(b, i)])
    return out


def _per_step(expo: str) -> dict[str, float]:
    acc, rs = {}, {}
    for fam in text_string_to_metric_families(expo):
        for s in fam.samples:
            if s.name == "sglang_ctxprof_accepted_tokens_total":
                acc[s.labels["ctx_bucket"]] = s.value
            elif s.name == "sglang_ctxprof_request_steps_total":
                rs[s.labels["ctx_bucket"]] = s.value
    return {b: acc[b] / rs[b] for b in rs}


def _text_p(txt: str) -> dict[str, list[float]]:
    lines = txt.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("acceptance by draft position"))
    out = {}
    for ln in lines[start + 3:]:
        if not ln.strip():
            break
        cells = ln.split()
        out[cells[0]] = [float(c) for c in cells[3:] if c != "-"]
    return out


def test_the_expected_p_i_by_hand(views):
    by = {a["label"]: a["acceptance_by_position"] for a in views["json"]["acceptance_by_ctx"]}
    # own ctx 100 (64-127): correct drafts (3,1,1,0,2) with budgets (3,3,1,1,3)
    # p1 = 4/5; p2 = #(correct>=2 | budget>=2) = 2/3; p3 = 1/3
    assert by["64-127"]["p"] == pytest.approx([4 / 5, 2 / 3, 1 / 3])
    # UNO at 1500 (1024-2047): accepted (2,5,3,4) - 2 = (0,3,1,2), budget 4: p = 3/4, 2/4, 1/4, 0
    assert by["1024-2047"]["p"] == pytest.approx([3 / 4, 2 / 4, 1 / 4, 0.0])
    assert by["1024-2047"]["mean_len"] == pytest.approx(1 + 6 / 4)
    # 3000: accepted (1,3,2,2,0): the 0 is unknown and not counted
    assert by["2048-4095"]["observed"] == [4, 2, 2]


def test_every_view_gives_the_same_acceptance_by_position(views):
    js = {a["label"]: a["acceptance_by_position"]["p"] for a in views["json"]["acceptance_by_ctx"]}
    assert js
    live, prom, txt = _p_by_bucket(views["live"]), _p_by_bucket(views["prom"]), _text_p(views["text"])
    assert set(live) == set(prom) == set(txt) == set(js)
    for b, p in js.items():
        assert live[b] == pytest.approx(p), b
        assert prom[b] == pytest.approx(p), b
        assert txt[b] == pytest.approx(p, abs=5e-4), b
    # the page draws each bucket's acceptance_by_position.p: the same numbers, same own-context key
    for b in views["json"]["buckets"]:
        if b.get("acceptance_by_position"):
            assert b["acceptance_by_position"]["p"] == pytest.approx(js[b["label"]])


def test_every_view_gives_the_same_accepted_tokens_per_step(views):
    js = {b["label"]: b["accepted_per_step"] for b in views["json"]["buckets"]}
    assert _per_step(views["live"]) == pytest.approx(js)
    assert _per_step(views["prom"]) == pytest.approx(js)
    lines = views["text"].splitlines()
    start = lines.index("decode steps by context bucket (mean ms per step)")
    table = lines[start + 3:start + 3 + len(js)]
    rows = {ln.split()[0]: float(ln.split()[3]) for ln in table}
    assert rows == pytest.approx(js, abs=5e-3)
    # trace export: the steps' accepted and request-steps add up to the same totals
    tr = steps_trace([(RankId().to_dict(), views["agg"].recent_steps(100))], 100)
    steps = [e for e in tr["traceEvents"] if e.get("name") == "decode step"]
    acc = sum(e["args"]["accepted"] for e in steps)
    rs = sum(e["args"]["batch_size"] for e in steps)
    tot = views["json"]["totals"]
    assert acc == tot["accepted"]
    assert acc / rs == pytest.approx(sum(b["accepted"] for b in views["json"]["buckets"])
                                     / sum(b["req_steps"] for b in views["json"]["buckets"]))
    # one request's trace and its summary (the OTel request span reads the same summary)
    req = views["agg"].request("r1")
    rt = request_trace(req)
    span = next(e for e in rt["traceEvents"] if e.get("name") == "request")
    rows = [e for e in rt["traceEvents"] if e.get("name") == "decode step"]
    assert span["args"]["accepted"] == sum(e["args"]["accepted"] for e in rows) == req["accepted"]
    assert req["accepted_per_step"] == pytest.approx(req["accepted"] / len(rows))


def test_the_page_reads_these_numbers_and_does_not_recount_them():
    js = (Path(__file__).resolve().parents[3] / "sglang_ctxprof" / "data" / "ui" / "app.js").read_text()
    assert "acceptance_by_position.p" in js and "accepted_per_step" in js
    assert not re.search(r"accepted\s*-\s*1", js)  # no bonus-of-one arithmetic in the page
