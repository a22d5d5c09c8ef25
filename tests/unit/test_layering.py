"""The data path runs one way, and the pure parts import nothing heavy (checked by AST, no import).

hooks -> recorder -> aggregator -> views.  records / aggregator / stats / buckets / request_log (and
the other pure helpers) import nothing of SGLang, torch, OTel, structlog or prometheus_client;
views never import hooks, runtime or recorder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "sglang_ctxprof"
HEAVY = ("sglang", "torch", "opentelemetry", "structlog", "prometheus_client", "fastapi", "starlette")
PURE = ("names", "records", "stats", "buckets", "aggregator", "request_log", "tracing_policy", "roofline",
        "config", "safety", "step_builder")
VIEWS_MAY_NOT = ("hooks", "runtime", "recorder", "instrumentor", "plugin")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            out.add(("." * node.level) + mod)
            out |= {("." * node.level) + (mod + "." if mod else "") + a.name for a in node.names}
    return out


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_nothing_heavy(name):
    bad = {i for i in imports(PKG / f"{name}.py") if i.lstrip(".").split(".")[0] in HEAVY and not i.startswith(".")}
    assert not bad, f"{name}.py imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((PKG / "views").glob("*.py")), ids=lambda p: p.name)
def test_views_do_not_import_collection(path):
    bad = {i for i in imports(path) if i.startswith("..") and i[2:].split(".")[0] in VIEWS_MAY_NOT}
    assert not bad, f"views/{path.name} imports {sorted(bad)}"


def test_modules_are_small_and_documented():
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        if path.name == "__init__.py" and len(src) < 200:
            continue
        assert ast.get_docstring(ast.parse(src)), f"{path} has no module docstring"
        assert len(src.splitlines()) <= 420, f"{path} has {len(src.splitlines())} lines"
