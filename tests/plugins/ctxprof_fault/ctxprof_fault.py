"""Test-only SGLang plugin: break one invariant of the self-audit at a time, switched from a file.

``CTXPROF_FAULT_FILE`` names a JSON file ``{"fault": name}`` the test rewrites between requests
(re-read when its mtime changes, so one server serves every fault); ``name`` is one of
``names.AUDIT_INVARIANTS`` or "" (none).  Each fault breaks that invariant and no other:

* engine side, in SGLang's own books (``Req.update_spec_correct_drafts_histogram``, called right
  after SGLang counts a verify step and its correct drafts):
  ``verify_ct`` - skew a count: a request's ``spec_verify_ct`` moves by 2 at its first step;
  ``accept_metric`` - freeze a counter: ``spec_num_correct_drafts`` stops moving;
* profiler side, in the record the drain thread builds from a step's plain facts (the last
  stage of ``model.facts.StepFacts.build``), as a regression of ours would:
  ``leaf_sum`` - a phase timed twice (draft + 1 ms, the step unchanged);
  ``accepted_bound`` - a draft count dropped (``draft_tokens`` = 1);
  ``hook_once`` - the MoE hook unhooked (no time lands in ``verify_moe``; ``verify_rest`` absorbs it);
  ``completion_tokens`` - a committed token lost at each step.

Not an invariant: ``stall_sink`` stalls a record sink (the Prometheus metrics view's ``observe``
waits while the fault is set), as a blocked log pipe or exporter would; ``hang_control`` hangs the
scheduler thread in its answer to a control command while the fault is set, as a hung rank would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

ENV = "CTXPROF_FAULT_FILE"
_STATE = {"mtime": None, "fault": "", "skewed": set()}


def fault() -> str:
    path = os.environ.get(ENV, "")
    try:
        m = os.stat(path).st_mtime_ns
    except OSError:
        return ""
    if m != _STATE["mtime"]:
        try:
            with open(path) as f:
                _STATE["fault"] = str(json.load(f).get("fault") or "")
        except (OSError, ValueError):
            _STATE["fault"] = ""
        _STATE["mtime"] = m
    return _STATE["fault"]


def _record_fault(rec):
    f = fault()
    if rec is None or rec.kind != "decode" or not f:
        return rec
    ph = dict(rec.phases_ms)
    if f == "leaf_sum" and "draft" in ph:
        ph["draft"] += 1.0
        return dataclasses.replace(rec, phases_ms=ph)
    if f == "accepted_bound":
        return dataclasses.replace(rec, draft_tokens=1)
    if f == "hook_once" and ph.get("verify_moe"):
        ph["verify_rest"] = ph.get("verify_rest", 0.0) + ph["verify_moe"]
        ph["verify_moe"] = 0.0
        return dataclasses.replace(rec, phases_ms=ph)
    if f == "completion_tokens":
        return dataclasses.replace(rec, committed=tuple(max(0, c - 1) for c in rec.committed))
    return rec


def register() -> None:
    if not os.environ.get(ENV):
        return
    from sglang.srt.managers.schedule_batch import Req

    from sglang_ctxprof.model.facts import StepFacts
    from sglang_ctxprof.model.records import StepRecord

    orig_build = StepFacts.build

    def build(self):
        out = orig_build(self)  # the facts again (their first stage), the record, or None
        return _record_fault(out) if type(out) is StepRecord else out

    StepFacts.build = build
    from sglang_ctxprof.views.metrics import MetricsView

    orig_observe = MetricsView.observe

    def observe(self, rec):
        while fault() == "stall_sink":  # a stalled sink: waits until the test clears the fault
            time.sleep(0.02)
        return orig_observe(self, rec)

    MetricsView.observe = observe
    from sglang_ctxprof.collect.session import CtxProfSession

    orig_control = CtxProfSession.handle_control

    def handle_control(self, rid, scheduler):
        while fault() == "hang_control":  # a hung rank: the scheduler thread answers nothing, steps nothing
            time.sleep(0.02)
        return orig_control(self, rid, scheduler)

    CtxProfSession.handle_control = handle_control
    orig_hist = Req.update_spec_correct_drafts_histogram

    def update_spec_correct_drafts_histogram(self, num_correct_drafts):
        f = fault()
        if f == "verify_ct" and self.rid not in _STATE["skewed"]:
            _STATE["skewed"].add(self.rid)
            self.spec_verify_ct += 1
        elif f == "accept_metric":
            self.spec_num_correct_drafts -= num_correct_drafts
        return orig_hist(self, num_correct_drafts)

    Req.update_spec_correct_drafts_histogram = update_spec_correct_drafts_histogram
