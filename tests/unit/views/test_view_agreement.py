"""Every view states the same facts about the same records: acceptance by draft position, accepted
tokens per step, accepted drafts, prompt tokens found in the prefix cache and where a step ends, in
the JSON profile, the text table, the live Prometheus counters, the ``?format=prometheus``
exposition, the page's data, the trace export and the OTel spans.

The records are the hard cases: UNO (two non-draft tokens per step), an adaptive budget (steps whose
budget stops short of the last positions), a batch of two with different own contexts, a request
whose accepted length is unknown (0), a plain-decode record, steps whose host end comes after their
measured end, and prefill batches with part of their prompts in the prefix cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.model import names
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import prometheus, text
from sglang_ctxprof.views.metrics import MetricsView
from sglang_ctxprof.views.otel import OtelView
from sglang_ctxprof.views.profile import Profile, build_profile
from sglang_ctxprof.views.trace_events import request_trace, steps_trace

PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}


def _rec(i, alg, ctx, acc, draft_tokens, depth=0, nd=1, host_ms=0.0):
    n = len(ctx)
    t = 1_000_000 * (i + 1)
    return StepRecord(step_id=i, kind="decode", algorithm=alg, rank=RankId(), rids=tuple(f"r{j}" for j in range(n)),
                      ctx_lens=tuple(ctx), accepted=tuple(acc), committed=tuple(max(0, a) for a in acc),
                      finished=(False,) * n, draft_tokens=draft_tokens, step_ms=6.123456789, phases_ms=PH,
                      t_start_ns=t, non_draft_tokens=nd, draft_depth=depth,
                      t_end_ns=t + int(host_ms * 1e6) if host_ms else 0)


def _prefill(i, ctx, cached):
    n = len(ctx)
    return StepRecord(step_id=i, kind="prefill", algorithm="EAGLE", rank=RankId(),
                      rids=tuple(f"p{i}-{j}" for j in range(n)), ctx_lens=ctx, accepted=(0,) * n,
                      committed=(0,) * n, finished=(False,) * n, draft_tokens=0, step_ms=4.123456789,
                      t_start_ns=1_000_000 * (i + 1), cached_lens=cached)


# Prompt tokens found in the prefix cache per prefill bucket (the batch's mean prompt length), by hand.
CACHED = {"256-511": 128 + 256, "512-1023": 512}


def records():
    out = []
    i = 0
    # EAGLE chain of 3, adaptive: budget 3 on some steps, 1 on others (positions 2..3 unobserved there)
    for acc, depth in [((4, 1), 3), ((2, 3), 3), ((2, 2), 1), ((1, 2), 1), ((3, 0), 3)]:
        out.append(_rec(i, "EAGLE", (100, 3000), acc, 4, depth))
        i += 1
    # UNO: block of 4 behind a clean root: accepted counts the bonus and the root (nd = 2); the host
    # got these steps back 0.75 ms after their measured end
    for acc in [(2,), (5,), (3,), (4,)]:
        out.append(_rec(i, "UNO", (1500,), acc, 5, 0, nd=2, host_ms=7.25))
        i += 1
    out.append(_rec(i, "NONE", (700,), (1,), 0))  # plain decode: no acceptance by position
    # prefill batches: mean prompts 400, 900 and 260
    out += [_prefill(i + 1, (300, 500), (128, 0)), _prefill(i + 2, (900,), (512,)), _prefill(i + 3, (260,), (256,))]
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


def _sum_by_bucket(expo: str, name: str, per: str = "ctx_bucket") -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(expo):
        for smp in fam.samples:
            if smp.name == name:
                out[smp.labels[per]] = out.get(smp.labels[per], 0.0) + smp.value
    return out


def test_every_view_gives_the_same_cached_prompt_tokens(views):
    js = {p["label"]: p[names.CACHED_TOKENS] for p in views["json"]["prefill"]}
    assert js == CACHED
    metric = names.METRIC_CACHED_TOKENS + "_total"
    assert _sum_by_bucket(views["live"], metric) == CACHED
    assert _sum_by_bucket(views["prom"], metric) == CACHED
    lines = views["text"].splitlines()
    start = lines.index("prefill batches (recorded separately)")
    assert lines[start + 1].split()[-2:] == ["cached", "tok"]
    rows = [ln.split() for ln in lines[start + 3:] if ln.strip()]
    assert {r[0]: int(r[-1]) for r in rows} == CACHED
    bk = Bucketing.parse("pow2")
    tr = steps_trace([(RankId().to_dict(), views["agg"].recent_steps(100))], 100)
    by: dict[str, int] = {}
    for e in tr["traceEvents"]:
        if e.get("name") == "prefill":
            a = e["args"]
            lab = bk.label(bk.index(a["prompt_tokens"] / a["batch_size"]))
            by[lab] = by.get(lab, 0) + a[names.CACHED_TOKENS]
    assert by == CACHED
    js_page = (Path(__file__).resolve().parents[3] / "sglang_ctxprof" / "data" / "ui" / "app.js").read_text()
    assert "q." + names.CACHED_TOKENS in js_page  # the page shows the prefill bucket's own number


def test_every_view_counts_accepted_drafts_the_same(views):
    bk = Bucketing.parse("pow2")
    want: dict[str, int] = {}
    for r in records():
        if r.kind != "decode" or r.algorithm == "NONE":
            continue
        for ctx, a, d in zip(r.ctx_lens, r.accepted, r.accepted_drafts):
            if a > 0:  # an unknown accepted length counts nothing
                lab = bk.label(bk.index(ctx))
                want[lab] = want.get(lab, 0) + d
    assert want == {"64-127": 3 + 1 + 1 + 0 + 2, "1024-2047": 0 + 3 + 1 + 2, "2048-4095": 0 + 2 + 1 + 1}
    js = {a["label"]: sum(a["acceptance_by_position"]["accepted"]) for a in views["json"]["acceptance_by_ctx"]}
    assert js == want
    metric = names.METRIC_POSITION_ACCEPTED + "_total"
    assert _sum_by_bucket(views["live"], metric) == want
    assert _sum_by_bucket(views["prom"], metric) == want
    lines = views["text"].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("acceptance by draft position"))
    for ln in lines[start + 3:start + 3 + len(want)]:
        label, n_steps, al = ln.split()[:3]
        assert (float(al) - 1) * int(n_steps) == pytest.approx(want[label], abs=5e-4 * int(n_steps))
    tr = steps_trace([(RankId().to_dict(), views["agg"].recent_steps(100))], 100)
    assert sum(e["args"]["accepted_drafts"] for e in tr["traceEvents"] if e.get("name") == "decode step") \
        == sum(want.values())


def _otel(req):
    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    OtelView(prov).export_request(req)
    return exp.get_finished_spans()


def _slices(tr, t0):
    """(name, start ns, end ns) of a trace's events, back on the nanosecond clock."""
    return [(e["name"], round(t0 + e["ts"] * 1e3), round(t0 + (e["ts"] + e["dur"]) * 1e3))
            for e in tr["traceEvents"] if e.get("ph") == "X"]


def test_every_view_ends_a_step_in_the_same_place(views):
    agg, recs = views["agg"], records()
    by_id = {r.step_id: r for r in recs}
    assert any(r.host_end_ns != r.end_ns for r in recs)  # the host end is a fact of its own
    # the trace export of recent steps: every step slice ends at the record's measured end
    tr = steps_trace([(RankId().to_dict(), agg.recent_steps(100))], 100)
    steps = [e for e in tr["traceEvents"] if e.get("name") in ("decode step", "prefill")]
    assert len(steps) == len(recs)
    for (name, start, end), e in zip(_slices({"traceEvents": steps}, tr["otherData"]["t0_ns"]), steps):
        r = by_id[e["args"]["step_id"]]
        assert (start, end) == (r.t_start_ns, r.end_ns), name
    # the JSON records and the aggregator's ring of recent steps (host ends, for the waterfall)
    assert [StepRecord.from_dict(d).end_ns for d in agg.recent_steps(100)] == [r.end_ns for r in recs]
    assert [(s.step_id, s.t_end_ns) for s in agg.ring] == [(r.step_id, r.host_end_ns) for r in recs]
    # one request: its summary and step rows, its trace and its OTel spans
    req = agg.request("r0")
    mine = [r for r in recs if "r0" in r.rids]
    assert req["t_end_ns"] == mine[-1].end_ns
    assert [row["t_end_ns"] for row in req["step_rows"]] == [r.host_end_ns for r in mine]
    rt = request_trace(req)
    ours = _slices(rt, rt["otherData"]["t0_ns"])
    assert [e for e in ours if e[0] == "decode step"] == [("decode step", r.t_start_ns, r.end_ns) for r in mine]
    spans = _otel(req)
    root = next(s for s in spans if s.name == names.SPAN_REQUEST)
    assert root.end_time == req["t_end_ns"]
    got = sorted((s.start_time, s.end_time) for s in spans if s.name == names.SPAN_STEP)
    assert got == [(r.t_start_ns, r.end_ns) for r in mine]
    # the phase layout: the OTel phase spans are the trace's phase slices, nanosecond for nanosecond
    phases = sorted((s.name[len(names.SPAN_PHASE_PREFIX):], s.start_time, s.end_time) for s in spans
                    if s.name[len(names.SPAN_PHASE_PREFIX):] in PH)
    assert phases and phases == sorted(e for e in ours if e[0] in PH)


# ---- requests SGLang aborted while they waited: every view counts and names them the same ---------
def _aborts():
    """(items in submission order, the RequestEnds): one request retracted after two decode steps
    and aborted, one aborted between prefill chunks, one aborted before any step, and a normal one."""
    from sglang_ctxprof.model.records import RequestEnd

    def pre(i, rid):
        return StepRecord(step_id=i, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                          ctx_lens=(300,), accepted=(0,), committed=(0,), finished=(False,), draft_tokens=0,
                          step_ms=4.0, t_start_ns=1_000_000 * (i + 1))

    def dec(i, rid, fin=False):
        return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                          ctx_lens=(300 + i,), accepted=(2,), committed=(2,), finished=(fin,), draft_tokens=4,
                          step_ms=6.0, phases_ms=PH, t_start_ns=1_000_000 * (i + 1))

    ends = [RequestEnd("ret", retracted=True, t_ns=90_000_000), RequestEnd("chunk", t_ns=91_000_000),
            RequestEnd("never", t_ns=92_000_000)]
    items = [pre(0, "ret"), dec(1, "ret"), dec(2, "ret"), pre(3, "chunk"), pre(4, "ok"), dec(5, "ok"),
             dec(6, "ok", fin=True), *ends]
    return items, ends


def test_every_view_counts_and_names_aborted_requests_the_same():
    from structlog.testing import LogCapture

    from sglang_ctxprof.collect.recorder import Recorder
    from sglang_ctxprof.model.config import LogSettings
    from sglang_ctxprof.model.guard import Guard
    from sglang_ctxprof.model.sinks import BindFacts
    from sglang_ctxprof.views.exporters import Exporters
    from sglang_ctxprof.views.logs import LogView, make_logger
    from sglang_ctxprof.views.policy import TracePolicy

    bk = Bucketing.parse("pow2")
    agg = Aggregator(bk)
    spans = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(spans))
    pol = TracePolicy(mode="all", slow_tok_s=0, slow_step_ms=0)
    exp = Exporters(bk, pol, facts=BindFacts(
        history=lambda rid, with_steps, stamp: agg.finished_request(rid, stamp, with_steps=with_steps),
        metrics_enabled=True), env={},
                    otel=OtelView(prov))
    cap, cfg = LogCapture(), LogSettings(fmt="json", summary_s=0)
    exp.attach_logs(LogView(cfg, exp.requests.current_policy,
                            logger=make_logger(cfg, renderer=cap, file=open("/dev/null", "w"))))
    reg = CollectorRegistry()
    exp.metrics.view, exp.metrics._checked = MetricsView(bk, reg), True
    rec = Recorder(agg, Guard(), sinks=exp.sinks)
    items, ends = _aborts()
    for it in items:
        rec.submit(it)
    rec.flush()
    want = {e.rid: e.kind for e in ends}
    assert want == {"ret": names.ABORT_RETRACTED, "chunk": names.ABORT_QUEUED, "never": names.ABORT_QUEUED}
    by_kind = {k: sum(1 for v in want.values() if v == k) for k in names.ABORT_KINDS}
    # the request history and the snapshot's total
    assert {r: agg.request(r)["aborted"] for r in ("ret", "chunk")} == {"ret": "retracted", "chunk": "queued"}
    assert agg.request("never") is None and agg.request("ok")["aborted"] == ""
    prof = build_profile(agg.snapshot())
    assert prof.totals.requests_aborted == len(ends) and prof.totals.aborted_by_kind() == by_kind
    assert Profile.from_dict(prof.to_dict(envelope=False)).totals.aborted_by_kind() == by_kind
    assert _sum_by_bucket(prometheus.render(prof), names.METRIC_REQUESTS_ABORTED + "_total",
                          names.LABEL_ABORT_KIND) == by_kind
    # the live Prometheus counter, by kind, every kind exported (0 is an answer)
    live = _sum_by_bucket(generate_latest(reg).decode(), names.METRIC_REQUESTS_ABORTED + "_total",
                          names.LABEL_ABORT_KIND)
    assert live == by_kind and sum(live.values()) == len(ends)
    # the structlog events: one per aborted request, named the same
    ev = [e for e in cap.entries if e["event"] == names.EVENT_REQUEST_ABORTED]
    assert {e["rid"]: e["aborted"] for e in ev} == want and len(ev) == len(ends)
    # the OTel root spans: each aborted request's root ended, named the same; nothing left open
    got = spans.get_finished_spans()
    roots = {s.attributes[names.ATTR_RID]: s for s in got if s.name == names.SPAN_REQUEST}
    assert set(roots) == {"ret", "chunk", "never", "ok"}
    assert {r: s.attributes.get(names.ATTR_ABORTED) for r, s in roots.items() if r != "ok"} == want
    assert names.ATTR_ABORTED not in roots["ok"].attributes
    ret = agg.request("ret")
    assert roots["ret"].end_time == ret["t_end_ns"] and roots["ret"].attributes[names.ATTR_STEPS] == 2
    assert len([s for s in got if s.name == names.SPAN_STEP and s.parent.span_id ==
                roots["ret"].context.span_id]) == 2
    assert (roots["never"].start_time, roots["never"].end_time) == (92_000_000, 92_000_000)
    assert [s for s in got if s.context.trace_id == roots["never"].context.trace_id] == [roots["never"]]
    st = exp.requests.otel.stats.to_dict()
    assert st["requests_exported"] == 4 and st["requests_dropped"] == 0
    assert exp.status()["requests_finished"] == 4
