"""The house: which room may import which, no import circle, and pure rooms that import nothing heavy.

Checked by AST over every import of the package, lazy ones inside functions included, without
importing anything.  Imports under ``if TYPE_CHECKING:`` never run: they name a type for the reader
and the editor (a hook's ``Profiler``, the control handler's ``CtxProfSession``) and are left out of
the graph; everything that runs is in it.  The rooms and their allowed directions:

* ``model/`` (pure) imports only ``model/``;
* ``aggregate/`` (pure) imports ``model/``;
* ``collect/`` (scheduler hot path) imports ``model/``, ``aggregate/`` and ``control/`` (it answers the channel);
* ``control/`` imports only ``model/``;
* ``views/`` imports ``model/``, ``aggregate/`` and ``control/``, never ``collect/``;
* ``testing/`` (test helpers shipped apart) imports ``model/``, ``aggregate/`` and ``collect/``;
* only the root entry points (``plugin``, ``http_app``, ``api``) and ``cli/`` wire rooms together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "sglang_ctxprof"
HEAVY = ("sglang", "torch", "opentelemetry", "structlog", "prometheus_client", "fastapi", "starlette")
ALLOWED = {
    "model": {"model"},
    "aggregate": {"model", "aggregate"},
    "collect": {"model", "aggregate", "control", "collect"},
    "control": {"model", "control"},
    "views": {"model", "aggregate", "control", "views"},
    "testing": {"model", "aggregate", "collect", "testing"},
}
PURE_ROOMS = ("model", "aggregate")
PURE_MODULES = ("control.protocol", "collect.step", "views.policy", "views.profile", "views.trace_events")  # pure modules in other rooms


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        out[name] = path
    return out


MODULES = _modules()


def _package_of(name: str, path: Path) -> list[str]:
    parts = name.split(".") if name else []
    return parts if path.name == "__init__.py" else parts[:-1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports(name: str) -> tuple[set[str], set[str]]:
    """(package modules imported, external top-level packages imported) by module ``name``."""
    path = MODULES[name]
    inside, outside = set(), set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "sglang_ctxprof":
                    inside.add(a.name.partition(".")[2])
                else:
                    outside.add(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                top = (node.module or "").split(".")[0]
                if top != "sglang_ctxprof":
                    outside.add(top)
                    continue
                base = (node.module or "").split(".")[1:]
            else:
                pkg = _package_of(name, path)
                base = pkg[: len(pkg) - (node.level - 1)] + ((node.module or "").split(".") if node.module else [])
            for a in node.names:
                sub = ".".join([*base, a.name])
                inside.add(sub if sub in MODULES else ".".join(base))
    return {m for m in inside if m in MODULES}, outside


def room(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in ALLOWED else None


GRAPH = {m: imports(m)[0] - {m} for m in MODULES}


def test_no_import_circle():
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if seen.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if room(m)))
def test_rooms_import_only_what_they_may(name):
    r = room(name)
    bad = {n for n in GRAPH[name] if (room(n) or n or "root") not in ALLOWED[r]}
    # a room's own package __init__ is part of the room
    bad = {n for n in bad if n != r}
    assert not bad, f"{name} ({r}/) may import only {sorted(ALLOWED[r])}/, but imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if room(m) in PURE_ROOMS or m in PURE_MODULES))
def test_pure_modules_import_nothing_heavy(name):
    bad = imports(name)[1] & set(HEAVY)
    assert not bad, f"{name} imports {sorted(bad)}"


def test_the_root_holds_only_entry_points():
    root = {m for m in MODULES if "." not in m and m not in ALLOWED and m not in ("", "cli")}
    assert root == {"api", "plugin", "http_app"}, root


def test_checker_sees_a_violation():
    """The rules above can fail: views importing collect is caught, and so is a circle."""
    assert "collect" not in ALLOWED["views"]
    assert room("collect.hooks") == "collect"
    assert "model.names" in GRAPH["collect.hooks"]  # relative imports are resolved


def test_modules_are_small_and_documented():
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        if path.name == "__init__.py" and len(src) < 200 and path.parent == PKG / "cli":
            continue
        assert ast.get_docstring(ast.parse(src)), f"{path} has no module docstring"
        assert len(src.splitlines()) <= 420, f"{path} has {len(src.splitlines())} lines"


def test_type_only_imports_are_left_out_and_run_time_ones_kept():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import A\nelse:\n"
                     "    from b import B\nfrom c import C\ndef f():\n    from d import D\n")
    assert {n.module for n in _runtime_nodes(tree) if isinstance(n, ast.ImportFrom)} == {"typing", "b", "c", "d"}
    # the hooks name the session's type; the session imports the hooks: one direction runs
    assert "collect.session" not in GRAPH["collect.hooks"] and "collect.hooks" in GRAPH["collect.session"]
