"""The self-audit in the views: live counter, ?format=prometheus family, status sum, diagnosis flag."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.names import AUDIT_INVARIANTS, METRIC_INVARIANT_VIOLATIONS
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.audit_view import audit_counts, audit_flags
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile
from sglang_ctxprof.views.metrics import MetricsView
from sglang_ctxprof.views.profile import Profile
from sglang_ctxprof.views.prometheus import render


def _samples(text: str) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["invariant"]: s.value for s in fams[METRIC_INVARIANT_VIOLATIONS].samples
            if s.name.endswith("_total")}


def _rec() -> StepRecord:
    return StepRecord(step_id=1, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("a",), ctx_lens=(9,),
                      accepted=(2,), committed=(2,), finished=(False,), draft_tokens=4, step_ms=1.0)


def test_live_counter_follows_the_audit_and_survives_a_reset():
    counts = dict.fromkeys(AUDIT_INVARIANTS, 0)
    reg = CollectorRegistry()
    view = MetricsView(Bucketing.parse("pow2"), reg, model="m", audit=lambda: counts)
    assert _samples(generate_latest(reg).decode()) == dict.fromkeys(AUDIT_INVARIANTS, 0.0)
    counts["verify_ct"] = 2  # the audit's counts since start (``Aggregator.audit_lifetime``): a reset
    view.observe(_rec())     # restarts the audit's own counts, not these
    view.observe(_rec())
    counts["verify_ct"] = 3
    view.observe(_rec())
    got = _samples(generate_latest(reg).decode())
    assert got["verify_ct"] == 3 and sum(got.values()) == 3


def _ranks(**bad: int) -> tuple:
    return tuple({"status": {"audit": {"violations": {**dict.fromkeys(AUDIT_INVARIANTS, 0), **bad},
                                       "checked": {}, "latest": []}}} for _ in range(2))


def test_prometheus_view_sums_the_ranks():
    text = render(Profile(bucketing={}, ranks=_ranks(hook_once=2)))
    got = _samples(text)
    assert got["hook_once"] == 4 and sum(got.values()) == 4
    assert METRIC_INVARIANT_VIOLATIONS not in render(Profile(bucketing={}, ranks=({"error": "x"},)))


def test_diagnosis_flags_a_violation_and_only_then():
    assert audit_counts(_ranks()) == dict.fromkeys(AUDIT_INVARIANTS, 0) and audit_flags(audit_counts(_ranks())) == []
    d = diagnose(evidence_from_profile(Profile(bucketing={}, ranks=_ranks(accept_metric=1))))
    (flag,) = [f for f in d["flags"] if f["kind"] == "invariant_violations"]
    assert "accept_metric x2" in flag["message"]
    d = diagnose(evidence_from_profile(Profile(bucketing={}, ranks=_ranks())))
    assert not [f for f in d["flags"] if f["kind"] == "invariant_violations"]


def test_the_prometheus_format_counter_keeps_its_count_over_a_reset():
    """``?format=prometheus`` exports the counts since the server started: a reset empties the
    profile's audit (the diagnosis reads that), never the counter."""
    from sglang_ctxprof.aggregate.audit import Audit

    audit = Audit()
    audit.counts["verify_ct"] = audit.lifetime["verify_ct"] = 3
    after_reset = Audit(lifetime=audit.lifetime)  # what a reset leaves: new counts, the same lifetime
    ranks = ({"status": {"audit": after_reset.status()}},)
    assert _samples(render(Profile(bucketing={}, ranks=ranks)))["verify_ct"] == 3
    assert audit_counts(ranks)["verify_ct"] == 0
