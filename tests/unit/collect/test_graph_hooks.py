"""collect/graph_hooks: the CUDA-graph hooks decide what every rank launches, so each one is a
``control`` hook (installed with the session, kept while timing is toggled off)."""

from __future__ import annotations

from sglang_ctxprof.collect import adapter, graph_hooks, hooks
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
