"""views/metrics.py and views/prometheus.py: bounded labels, parseable exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.views.profile import build_profile
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.names import REPORTED_PHASES
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.metrics import MetricsView, maybe_create
from sglang_ctxprof.views.prometheus import render

PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5,
      "draft_extend": 0.5, "overhead": 0.5}


def _recs():
    out = []
    for i, ctx in enumerate([70, 70, 3000, 3001, 3002, 900000, 5_000_000]):
        out.append(StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a", "b"),
                              ctx_lens=(ctx, ctx), accepted=(3, 2), committed=(3, 2), finished=(False, False),
                              draft_tokens=4, step_ms=6.5, phases_ms=PH, t_start_ns=i))
    out.append(StepRecord(step_id=99, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(5,),
                          accepted=(0,), committed=(0,), finished=(False,), draft_tokens=0, step_ms=9.0))
    return out


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_live_metrics_have_bounded_labels():
    reg = CollectorRegistry()
    bk = Bucketing.parse("pow2", max_ctx=1 << 20)
    view = MetricsView(bk, reg)
    for r in _recs():
        view.observe(r)
    fam = _families(generate_latest(reg).decode())
    h = fam["sglang_ctxprof_phase_seconds"]
    assert h.type == "histogram"
    labels = {(s.labels["phase"], s.labels["ctx_bucket"]) for s in h.samples if s.name.endswith("_count")}
    assert {p for p, _ in labels} == set(REPORTED_PHASES) - {"unattributed"}
    assert {b for _, b in labels} == {"64-127", "2048-4095", "524288-1048575", "1048576+"}
    step_count = {s.labels["ctx_bucket"]: s.value for s in h.samples
                  if s.name.endswith("_count") and s.labels["phase"] == "step"}
    assert step_count == {"64-127": 2, "2048-4095": 3, "524288-1048575": 1, "1048576+": 1}
    acc = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_accepted_tokens"].samples
           if s.name.endswith("_total")}
    assert acc["2048-4095"] == 15
    steps = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_steps"].samples if s.name.endswith("_total")}
    assert sum(steps.values()) == 7  # prefill is not a decode step
    assert maybe_create(bk, False) is None


def test_format_prometheus_text_parses_and_matches_live_counters():
    agg = Aggregator(Bucketing.parse("pow2"))
    for r in _recs():
        agg.observe(r)
    text = render(build_profile(agg.snapshot()))
    fam = _families(text)
    steps = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_steps"].samples}
    assert steps == {"64-127": 2, "2048-4095": 3, "524288-1048575": 1, "1048576+": 1}
    acc = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_accepted_tokens"].samples}
    assert acc["64-127"] == 10
    ph = fam["sglang_ctxprof_phase_seconds"]
    cnt = {(s.labels["phase"], s.labels["ctx_bucket"]): s.value for s in ph.samples if s.name.endswith("_count")}
    assert cnt[("step", "2048-4095")] == 3
    sums = {(s.labels["phase"], s.labels["ctx_bucket"]): s.value for s in ph.samples if s.name.endswith("_sum")}
    assert abs(sums[("verify", "2048-4095")] - 0.009) < 1e-9
