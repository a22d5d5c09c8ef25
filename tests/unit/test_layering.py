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


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg).with_suffix("").parts
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


def imports(name: str, modules: dict[str, Path] = MODULES) -> tuple[set[str], set[str]]:
    """(package modules imported, external top-level packages imported) by module ``name``."""
    path = modules[name]
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
                inside.add(sub if sub in modules else ".".join(base))
    return {m for m in inside if m in modules}, outside


def room(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in ALLOWED else None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: imports(m, modules)[0] - {m} for m in modules}


GRAPH = import_graph(MODULES)


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a closed path, or None."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in seen and (cycle := visit(n)):
                return cycle
        stack.pop()
        seen[m] = 2
        return None

    for m in sorted(graph):
        if m not in seen and (cycle := visit(m)):
            return cycle
    return None


def room_violations(name: str, graph: dict[str, set[str]]) -> set[str]:
    """The modules ``name`` imports that its room may not (a room's own package __init__ is in the room)."""
    r = room(name)
    return {n for n in graph[name] if (room(n) or n or "root") not in ALLOWED[r] and n != r}


def heavy_imports(name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    return imports(name, modules)[1] & set(HEAVY)


def test_no_import_circle():
    cycle = find_circle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("name", sorted(m for m in MODULES if room(m)))
def test_rooms_import_only_what_they_may(name):
    bad = room_violations(name, GRAPH)
    assert not bad, f"{name} ({room(name)}/) may import only {sorted(ALLOWED[room(name)])}/, but imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if room(m) in PURE_ROOMS or m in PURE_MODULES))
def test_pure_modules_import_nothing_heavy(name):
    bad = heavy_imports(name)
    assert not bad, f"{name} imports {sorted(bad)}"


def test_the_root_holds_only_entry_points():
    root = {m for m in MODULES if "." not in m and m not in ALLOWED and m not in ("", "cli")}
    assert root == {"api", "plugin", "http_app"}, root


SYNTHETIC = {  # a small package with one of each violation, in each import form the checker reads
    "__init__.py": '"""root"""',
    "model/__init__.py": '"""m"""',
    "model/names.py": '"""clean"""\nimport json\n',
    "model/a.py": '"""circle, relative"""\nfrom . import b\n',
    "model/b.py": '"""circle, absolute"""\nfrom sglang_ctxprof.model.a import X\n',
    "model/heavy.py": '"""lazy heavy"""\ndef f():\n    import torch.cuda\n    from opentelemetry import trace\n',
    "collect/__init__.py": '"""c"""',
    "collect/hooks.py": '"""clean"""\nfrom ..model import names\n',
    "views/__init__.py": '"""v"""',
    "views/up.py": '"""views -> collect, relative"""\nfrom ..collect.hooks import x\n',
    "views/up_lazy.py": '"""views -> collect, lazy absolute"""\ndef f():\n    import sglang_ctxprof.collect\n',
    "views/root.py": '"""views -> an entry point"""\nfrom .. import plugin\n',
    "plugin.py": '"""entry"""',
}


def test_checker_reports_synthetic_violations(tmp_path):
    """The rules above can fail: fed a package that breaks each rule, the checker names each break."""
    pkg = tmp_path / "sglang_ctxprof"
    for rel, src in SYNTHETIC.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(src)
    mods = _modules(pkg)
    graph = import_graph(mods)
    assert graph["collect.hooks"] == {"model.names"}  # relative imports are resolved
    assert set(find_circle(graph) or []) == {"model.a", "model.b"}
    assert room_violations("views.up", graph) == {"collect.hooks"}
    assert room_violations("views.up_lazy", graph) == {"collect"}
    assert room_violations("views.root", graph) == {"plugin"}
    assert room_violations("collect.hooks", graph) == set() and room_violations("model.a", graph) == set()
    assert heavy_imports("model.heavy", mods) == {"torch", "opentelemetry"}
    assert heavy_imports("model.names", mods) == set()
    del graph["model.b"], graph["model.a"]
    graph = {m: deps - {"model.a", "model.b"} for m, deps in graph.items()}
    assert find_circle(graph) is None


def test_modules_are_small_and_documented():
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        if path.name == "__init__.py" and len(src) < 200 and path.parent == PKG / "cli":
            continue
        assert ast.get_docstring(ast.parse(src)), f"{path} has no module docstring"
        assert len(src.splitlines()) <= 400, f"{path} has {len(src.splitlines())} lines"


def test_type_only_imports_are_left_out_and_run_time_ones_kept():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import A\nelse:\n"
                     "    from b import B\nfrom c import C\ndef f():\n    from d import D\n")
    assert {n.module for n in _runtime_nodes(tree) if isinstance(n, ast.ImportFrom)} == {"typing", "b", "c", "d"}
    # the hooks name the session's type; the session imports the hooks: one direction runs
    assert "collect.session" not in GRAPH["collect.hooks"] and "collect.hooks" in GRAPH["collect.session"]


def test_test_basenames_are_unique():
    """pytest imports test modules by basename from the root: two files of one name abort collection."""
    seen: dict[str, list[str]] = {}
    root = PKG.parent
    for p in (root / "tests").rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(root)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}
