"""collect/graph_hooks: the CUDA-graph hooks decide what every rank launches, so each one is a
``control`` hook (installed with the session, kept while timing is toggled off)."""

from __future__ import annotations

from sglang_ctxprof.collect import adapter, graph_hooks, hooks
from graph_rig import cleanup  # noqa: F401 - the fixture
from sglang_ctxprof.collect.session import HOOKS


def test_every_graph_hook_is_a_control_hook():
    missing = set(graph_hooks.HOOKS) - adapter.CONTROL_HOOKS
    assert not missing, f"graph hooks outside the control group (a toggle could split ranks): {sorted(missing)}"


def test_every_control_hook_exists_and_every_adapter_target_names_a_hook():
    assert adapter.CONTROL_HOOKS <= set(HOOKS)
    assert set(hooks.HOOKS).isdisjoint(graph_hooks.HOOKS)
    for t in adapter.TARGETS:
        assert t.hook in HOOKS, t
        assert t.group == ("control" if t.hook in adapter.CONTROL_HOOKS else "timing"), t


def test_a_failing_overlap_decision_gives_sglangs_own_answer(monkeypatch, cleanup):
    """The gate's own code raising (here the timer's ``hold_overlap``) answers what SGLang answered,
    alike on every rank, and is reported as a hook failure; SGLang's call never sees the error."""
    from fakes import Batch
    from graph_rig import build

    p, session, sched = build(monkeypatch, k=1)
    cleanup.append((p, session))

    def broken(last_step_id, next_step_id):
        raise ZeroDivisionError("decision code bug")

    monkeypatch.setattr(p.graph, "hold_overlap", broken)
    last = Batch([])
    last.forward_iter = sched.forward_ct = 5
    assert graph_hooks.overlap_gate(lambda *a: False, sched, None, last) is False
    assert graph_hooks.overlap_gate(lambda *a: True, sched, None, last) is True
    assert "ZeroDivisionError: decision code bug" in p.guard.status()["components"]["hooks"]
