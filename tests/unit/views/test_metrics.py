"""views/metrics.py and views/prometheus.py: bounded labels, parseable exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.views.profile import build_profile
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.names import METRIC_DEGRADED, REPORTED_PHASES
from sglang_ctxprof.model.records import RankId, RequestEnd, StepRecord
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
    assert {p for p, _ in labels} == set(REPORTED_PHASES) - {"unattributed", "decode", "decode_attn", "decode_moe",
                                                              "decode_rest"}  # plain decode only
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


def test_live_metrics_for_the_dashboard_model_acceptance_drops_and_degraded():
    reg = CollectorRegistry()
    state = {"dropped": 0, "degraded": None, "sink_dropped": 0}
    view = MetricsView(Bucketing.parse("pow2"), reg, model="tiny-dsv3", dropped=lambda: state["dropped"],
                       degraded=lambda: state["degraded"], sink_dropped=lambda: state["sink_dropped"])
    fam = _families(generate_latest(reg).decode())
    # exported before any step: a dashboard's "dropped" and "degraded" panels have an answer (0)
    assert [(s.labels, s.value) for s in fam["sglang_ctxprof_dropped_records"].samples if s.name.endswith("_total")] \
        == [({"model_name": "tiny-dsv3"}, 0.0)]
    assert {s.labels["component"]: s.value for s in fam["sglang_ctxprof_degraded"].samples} == \
        {c: 0.0 for c in ("hooks", "recorder", "aggregator", "exporter", "logs", "metrics", "control", "capture")}
    recs = _recs()
    view.observe(recs[0])  # accepted (3, 2): positions 1, 2 accepted once; 1 once more; 3 tried, never
    state["dropped"], state["degraded"], state["sink_dropped"] = 5, {"components": {"exporter": "boom"}}, 7
    view.observe(recs[1])
    fam = _families(generate_latest(reg).decode())
    s = {s.name: s for s in fam["sglang_ctxprof_request_steps"].samples if s.name.endswith("_total")}
    assert s["sglang_ctxprof_request_steps_total"].value == 4
    assert s["sglang_ctxprof_request_steps_total"].labels == {"model_name": "tiny-dsv3", "ctx_bucket": "64-127"}
    draft = [x.value for x in fam["sglang_ctxprof_draft_tokens"].samples if x.name.endswith("_total")]
    assert draft == [16.0]
    pos = {x.labels["position"]: x.value for x in fam["sglang_ctxprof_position_accepted"].samples
           if x.name.endswith("_total")}
    assert pos == {"1": 4.0, "2": 2.0, "3": 0.0}
    assert [x.value for x in fam["sglang_ctxprof_dropped_records"].samples if x.name.endswith("_total")] == [5.0]
    # records a stalled sink made these series miss: counted beside the queue's drops
    assert [x.value for x in fam["sglang_ctxprof_sink_dropped_records"].samples if x.name.endswith("_total")] == [7.0]
    deg = {x.labels["component"]: x.value for x in fam["sglang_ctxprof_degraded"].samples}
    assert deg["exporter"] == 1.0 and sum(deg.values()) == 1.0
    h = fam["sglang_ctxprof_phase_seconds"]
    assert {x.labels["model_name"] for x in h.samples} == {"tiny-dsv3"}


def test_a_series_appears_only_once_it_has_a_value_whatever_the_order_of_records():
    """Children resolved once per bucket must not create series early: a prefill-only bucket has no
    decode series, a decode-only bucket no cached-tokens series, and a phase never seen no histogram;
    records fed twice count twice (a cached child is the live one)."""
    reg = CollectorRegistry()
    view = MetricsView(Bucketing.parse("pow2"), reg)
    pre = StepRecord(step_id=1, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=("p",), ctx_lens=(5,),
                     accepted=(0,), committed=(0,), finished=(False,), draft_tokens=0, step_ms=9.0,
                     cached_lens=(3,))
    dec = StepRecord(step_id=2, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(3000,),
                     accepted=(3,), committed=(3,), finished=(False,), draft_tokens=4, step_ms=6.5,
                     phases_ms={"draft": 1.0, "verify": 5.5})
    for r in (pre, dec, pre, dec):
        view.observe(r)
    fam = _families(generate_latest(reg).decode())

    def by_bucket(name):
        return {s.labels["ctx_bucket"]: s.value for s in fam[name].samples if s.name.endswith("_total")}

    assert by_bucket("sglang_ctxprof_steps") == {"2048-4095": 2}
    assert by_bucket("sglang_ctxprof_request_steps") == {"2048-4095": 2}
    assert by_bucket("sglang_ctxprof_accepted_tokens") == {"2048-4095": 6}
    assert by_bucket("sglang_ctxprof_prefill_cached_tokens") == {"0-63": 6}
    h = fam["sglang_ctxprof_phase_seconds"]
    assert {(s.labels["phase"], s.value) for s in h.samples if s.name.endswith("_count")} == {
        ("step", 2), ("draft", 2), ("verify", 2)}
    observed = {s.labels["position"]: s.value for s in fam["sglang_ctxprof_position_observed"].samples
                if s.name.endswith("_total")}
    assert observed == {"1": 2, "2": 2, "3": 2}


def test_the_degraded_gauge_shows_a_failure_that_stops_the_records():
    """A failed ``metrics`` (or ``recorder``, ``hooks``) component stops the records that used to
    refresh the gauge: the guard tells the view itself, so an alert on the gauge still fires; and a
    view that ends leaves the registry to the next one."""
    from prometheus_client import REGISTRY

    from sglang_ctxprof.model.guard import Guard
    from sglang_ctxprof.model.sinks import BindFacts
    from sglang_ctxprof.views.exporters import MetricsSink

    def deg(reg):
        fam = _families(generate_latest(reg).decode())
        return {x.labels["component"]: x.value for x in fam["sglang_ctxprof_degraded"].samples}

    for _ in range(2):  # a second session in the same process builds its view again
        guard = Guard()
        sink = MetricsSink(Bucketing.parse("pow2"), BindFacts())
        sink.bind(BindFacts(metrics_enabled=True, degraded=guard.status, watch_faults=guard.listen,
                            guarded=guard.run))
        assert sink.view is not None and sum(deg(REGISTRY).values()) == 0  # from the bind on: no record yet
        guard.fail("hooks", RuntimeError("boom"))  # at the first step: no record ever reaches the sink
        assert deg(REGISTRY)["hooks"] == 1.0
        guard.clear()
        assert deg(REGISTRY)["hooks"] == 0.0
        sink.observe(_recs()[0])
        guard.fail("metrics", RuntimeError("boom"))  # the sink itself: no record reaches it after this
        assert deg(REGISTRY)["metrics"] == 1.0
        sink.stop()
        assert METRIC_DEGRADED not in {m.name for m in REGISTRY.collect()}
        sink.end(RequestEnd("late", t_ns=1))  # a drain thread stuck past the stop: nothing registered again
        assert sink.view is None and METRIC_DEGRADED not in {m.name for m in REGISTRY.collect()}


def test_every_rank_shows_its_failures_on_the_degraded_gauge_and_only_the_primary_counts_steps():
    """A TP peer's hooks or capture triggers fail on that rank alone: its degraded gauge says so (the
    gauge is ``livemax`` over the processes), while its steps, the primary's too, count once."""
    from prometheus_client import REGISTRY

    from sglang_ctxprof.model.guard import Guard
    from sglang_ctxprof.model.sinks import BindFacts
    from sglang_ctxprof.views.exporters import MetricsSink

    guard = Guard()
    sink = MetricsSink(Bucketing.parse("pow2"), BindFacts())
    sink.bind(BindFacts(primary=False, metrics_enabled=True, degraded=guard.status, watch_faults=guard.listen,
                        guarded=guard.run))
    try:
        sink.observe(_recs()[0])
        sink.end(RequestEnd("gone", t_ns=1))
        fam = _families(generate_latest(REGISTRY).decode())
        assert not [x for x in fam["sglang_ctxprof_steps"].samples if x.name.endswith("_total")]
        assert not [x.value for x in fam["sglang_ctxprof_requests_aborted"].samples if x.value]
        guard.fail("capture", RuntimeError("trigger bug"))
        fam = _families(generate_latest(REGISTRY).decode())
        deg = {x.labels["component"]: x.value for x in fam["sglang_ctxprof_degraded"].samples}
        assert deg["capture"] == 1.0 and sum(deg.values()) == 1.0
    finally:
        sink.stop()


def test_the_violations_counter_keeps_every_violation_across_resets():
    """``POST /ctx_profile/reset`` restarts the audit's counts (status, diagnosis, ``?format=prometheus``);
    the live counter never decreases and counts each violation once, also one the sink reads only
    after a reset and the next violations (the sinks run after the aggregator)."""
    agg = Aggregator()
    reg = CollectorRegistry()
    view = MetricsView(agg.bucketing, reg, model="m", audit=agg.audit_lifetime)
    bad = [StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("x",), ctx_lens=(70,),
                      accepted=(3,), committed=(3,), finished=(False,), draft_tokens=4, step_ms=5.0,
                      phases_ms={**PH, "draft": 9.0}, t_start_ns=i) for i in range(9)]

    def live():
        return reg.get_sample_value("sglang_ctxprof_invariant_violations_total",
                                    {"model_name": "m", "invariant": "leaf_sum"})

    for rec in bad[:3]:
        agg.observe(rec)
        view.observe(rec)
    agg.reset()
    for rec in bad[3:6]:
        agg.observe(rec)
        view.observe(rec)
    assert live() == 6 and agg.audit.counts["leaf_sum"] == 3
    agg.reset()
    for rec in bad[6:]:
        agg.observe(rec)
    for rec in bad[6:]:
        view.observe(rec)
    assert live() == 9 and agg.audit.counts["leaf_sum"] == 3
