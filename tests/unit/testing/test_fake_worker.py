"""The benchmarks' fake worker: draft before verify, the result handed back, hook paths that resolve."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from sglang_ctxprof.testing.fake_worker import HOOKS, AcceptLens, FakeReq, FakeWorker


def test_worker_drafts_then_verifies_and_returns_the_result():
    calls = []
    w = FakeWorker(lambda: calls.append("forward"))
    w.draft = lambda batch: calls.append("draft")
    batch = SimpleNamespace(result=object())
    assert w.forward_batch_generation(batch) is batch.result
    assert calls == ["draft", "forward"]
    assert FakeWorker().forward_batch_generation(batch) is batch.result  # no forward: nothing runs


def test_hook_paths_name_real_methods():
    for path, hook in HOOKS:
        mod, cls, meth = path.rsplit(".", 2)
        assert callable(getattr(getattr(importlib.import_module(mod), cls), meth)), (path, hook)
    assert {h for _, h in HOOKS} == {"draft", "verify"}


def test_req_and_accept_lens_faces():
    r = FakeReq("r1", [0, 0, 0], life=5)
    assert (r.rid, len(r.origin_input_ids), r.output_ids, r.life, r.finished()) == ("r1", 3, [1], 5, False)
    r.finished_reason = "length"
    assert r.finished()
    vals = [1, 2, 3]
    al = AcceptLens(vals)
    out = al.tolist()
    out.append(9)
    assert al.is_cpu and al.tolist() == [1, 2, 3]  # a fresh list each time, as a tensor's
