"""tests/plugins/toy_ddtree_block keeps its own decode step: none of it is a seam ctxprof hooks.

The server test (tests/server/test_custom_block_algorithm.py) shows draft and draft_extend only
because the worker declares them; that proves ctxprof names nothing else only while the worker's
step stays off ctxprof's DFLASH seams.  Read from the source (no SGLang import): the worker's own
methods are not hook targets, its decode step calls none of DFLASH's hooked methods through
``self``, and it declares exactly the phases it claims, all of them declarable.
"""

from __future__ import annotations

import ast

from conftest import ROOT
from sglang_ctxprof.collect import block_adapter
from sglang_ctxprof.collect.adapter import TARGETS
from sglang_ctxprof.model.names import DECLARABLE_PHASES

WORKER = ROOT / "tests" / "plugins" / "toy_ddtree_block" / "toy_ddtree_block" / "worker.py"
STEP = ("_tree_step", "_draft_block", "_tree_from_block", "_verify_block", "_append_block_kv")


def _methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(WORKER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ToyDDTreeBlockWorker")
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _self_calls(fn: ast.FunctionDef) -> set[str]:
    return {c.func.attr for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"}


def test_own_step_methods_are_not_hook_targets():
    methods = _methods()
    assert set(STEP) <= set(methods), sorted(methods)
    hooked = {t.path.rsplit(".", 1)[1] for t in TARGETS}
    assert not set(STEP) & hooked


def test_decode_step_calls_no_hooked_dflash_method():
    dflash_seams = {path.rsplit(".", 1)[1] for path, _ in block_adapter.WORKER_TARGETS["DFLASH"]}
    methods = _methods()
    for name in STEP:
        assert not _self_calls(methods[name]) & dflash_seams, name


def test_declares_draft_and_draft_extend_only():
    declared = {c.args[0].value for c in ast.walk(ast.parse(WORKER.read_text()))
                if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "_phase"}
    assert declared == {"draft", "draft_extend"}
    assert declared <= DECLARABLE_PHASES
