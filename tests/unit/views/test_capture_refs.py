"""Links to the deep captures (``views.capture_refs``): the request span's attributes, exported through
the OTel SDK's in-memory exporter, the exporters' request history that carries them, and the
diagnosis flag listing recent captures."""

from __future__ import annotations

import fakes
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_ctxprof.aggregate.requests import RequestLog
from sglang_ctxprof.collect.capture import CaptureInfo
from sglang_ctxprof.collect.profiler import Profiler
from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import capture_refs
from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_profile
from sglang_ctxprof.views.exporters import build
from sglang_ctxprof.views.otel import OtelView
from sglang_ctxprof.views.profile import Profile

T0 = 1_700_000_000_000_000_000


def rec(step_id: int, kind: str = names.KIND_DECODE, fin: bool = False, rid: str = "r1") -> StepRecord:
    return StepRecord(step_id=step_id, kind=kind, algorithm="EAGLE", rank=RankId(), rids=(rid,), ctx_lens=(100,),
                      accepted=(2,), committed=(2,), finished=(fin,), draft_tokens=4, step_ms=5.0,
                      phases_ms={"draft": 1.0, "verify": 3.0}, t_start_ns=T0 + step_id * 10**7)


def request(steps=(1, 2, 3, 4, 5)) -> dict:
    log = RequestLog()
    log.observe(rec(0, names.KIND_PREFILL))
    for i, s in enumerate(steps):
        log.observe(rec(s, fin=i == len(steps) - 1))
    return log.get("r1")


def info(cid: str, trigger: str, step_ids: list[int], path: str = "", state: str = names.CAPTURE_DONE,
         rid: str | None = None, at: int = 0) -> CaptureInfo:
    return CaptureInfo(id=cid, trigger=trigger, steps=len(step_ids), rid=rid, state=state, step_ids=step_ids,
                       rids=["r1"], path=path or None, requested_ns=at)


def export(req: dict):
    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    OtelView(prov).export_request(req)
    (root,) = [s for s in exp.get_finished_spans() if s.name == names.SPAN_REQUEST]
    return root


def test_the_request_span_names_the_captures_that_covered_its_steps():
    req = request()
    req["captures"] = [info("1-slow_request-9", names.TRIGGER_SLOW_REQUEST, [3, 4, 5, 6], "/tmp/c/1.trace.json.gz",
                            rid="r1").to_dict(),
                       info("2-manual-9", names.TRIGGER_MANUAL, [40, 41]).to_dict(),  # none of its steps
                       info("3-rid-9", names.TRIGGER_RID, [1], state=names.CAPTURE_EXPORTING).to_dict()]
    a = export(req).attributes
    assert list(a[names.ATTR_CAPTURE_ID]) == ["1-slow_request-9", "3-rid-9"]
    assert list(a[names.ATTR_CAPTURE_TRIGGER]) == [names.TRIGGER_SLOW_REQUEST, names.TRIGGER_RID]
    assert list(a[names.ATTR_CAPTURE_URI]) == [names.ROUTE_CAPTURE + "/1-slow_request-9",
                                               names.ROUTE_CAPTURE + "/3-rid-9"]
    assert list(a[names.ATTR_CAPTURE_PATH]) == ["/tmp/c/1.trace.json.gz", ""]  # not written yet
    assert list(a[names.ATTR_CAPTURE_STEPS]) == [1, 3, 4, 5]


def test_a_request_no_capture_covered_has_no_capture_attributes():
    req = request()
    assert not any(k.startswith("sglang.ctxprof.capture.") for k in export(req).attributes)
    req["captures"] = [info("2-manual-9", names.TRIGGER_MANUAL, [40, 41]).to_dict()]
    assert not any(k.startswith("sglang.ctxprof.capture.") for k in export(req).attributes)


def test_the_exporters_history_carries_the_captures_of_the_request():
    p = Profiler(CtxProfConfig.from_env({names.ENV_LOG: "off"}))
    exp = build(p.config, env={})
    exp.bind(p.bind_facts(fakes.Scheduler(fakes.Worker())))  # the facts the profiler hands over at bind
    history = exp.facts.history
    for r in (rec(0, names.KIND_PREFILL), rec(1), rec(2, fin=True)):
        p.aggregator.observe(r)
    end = rec(2, fin=True).end_ns  # the stamp of the record that finished it
    assert "captures" not in history("r1", True, end)  # no capture taken: nothing added, nothing read
    p.capture.history.append(info("1-rid-9", names.TRIGGER_RID, [2], rid="r1"))
    p.capture.history.append(info("2-manual-9", names.TRIGGER_MANUAL, [7]))
    p.capture.history[-1].rids = ["other"]
    assert [c["id"] for c in history("r1", True, end)["captures"]] == ["1-rid-9"]


def test_the_diagnosis_flags_recent_captures_with_where_to_fetch_them():
    caps = [info(f"{i}-slow_step-9", names.TRIGGER_SLOW_STEP, [10 * i, 10 * i + 1], f"/tmp/c/{i}.gz", at=i)
            for i in range(1, 8)]
    caps[5].state = names.CAPTURE_DELETED
    caps[6] = info("7-slow_request-9", names.TRIGGER_SLOW_REQUEST, [70, 71, 72], rid="r9", at=7,
                   state=names.CAPTURE_FAILED)
    caps[6].error = "request r9 not seen in 16 steps"
    status = {"capture": {"captures": [c.to_dict() for c in caps]}}
    prof = Profile(ranks=({"status": status},))
    d = diagnose(evidence_from_profile(prof, source="server"))
    (flag,) = [f for f in d["flags"] if f["kind"] == capture_refs.FLAG_KIND]
    msg = flag["message"]
    assert msg.startswith("5 recent deep capture(s): 2-slow_step-9 (slow_step, steps 20-21, done): "
                          f"GET {names.ROUTE_CAPTURE}/2-slow_step-9?format=timeline (file /tmp/c/2.gz)")
    assert "1-slow_step-9" not in msg and "6-slow_step-9" not in msg  # older than the newest 5; deleted
    assert "7-slow_request-9 (slow_request for request r9, steps 70-72, failed): failed: request r9 not seen" in msg
    none = diagnose(evidence_from_profile(Profile(ranks=({"status": {"capture": {"captures": []}}},))))
    assert not [f for f in none["flags"] if f["kind"] == capture_refs.FLAG_KIND]
