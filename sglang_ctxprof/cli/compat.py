"""Offline compatibility check: do our hook targets exist, with compatible signatures, in a release?

For each SGLang wheel cached in ``.cache/wheels`` (``make fetch-compat`` runs
``pip download --no-deps sglang==X`` once; nothing here touches the network), or for an unpacked
source tree such as the installed package, every target in :data:`adapter.TARGETS` and
:data:`adapter.FRAMEWORK` is resolved by reading source text and parsing it with :mod:`ast`
(never importing it) and its parameters are compared with :data:`adapter.SIGNATURES`.

A method missing from a class is looked up in the class's bases, following ``from X import Base``
inside the same release, so an inherited method resolves as it would at run time.

``python -m sglang_ctxprof.cli.compat [--wheels DIR] [--source DIR]`` prints one line per
version and target and exits 1 when a required target fails in a release listed as supported.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from typing import Iterable, Optional

from ..collect import adapter

_WHEEL_RE = re.compile(r"^sglang-([0-9][^-]*)-.*\.whl$")
MAX_BASE_DEPTH = 6


class Source:
    """Read ``sglang/...`` module text from a wheel (zip) or a directory containing ``sglang/``."""

    def __init__(self, location: str, version: str) -> None:
        self.location, self.version = location, version
        self._zip = zipfile.ZipFile(location) if location.endswith(".whl") else None
        self._names = set(self._zip.namelist()) if self._zip else None
        self._ast: dict[str, Optional[ast.Module]] = {}

    def _read(self, rel: str) -> Optional[str]:
        if self._zip is not None:
            return self._zip.read(rel).decode("utf-8", "replace") if rel in (self._names or ()) else None
        path = os.path.join(self.location, rel)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def module(self, dotted: str) -> Optional[ast.Module]:
        """The parsed module ``dotted`` (a .py file or a package __init__), or None."""
        if dotted not in self._ast:
            base = dotted.replace(".", "/")
            text = self._read(base + ".py")
            if text is None:
                text = self._read(base + "/__init__.py")
            try:
                self._ast[dotted] = ast.parse(text) if text is not None else None
            except SyntaxError:
                self._ast[dotted] = None
        return self._ast[dotted]

    def is_package(self, dotted: str) -> bool:
        return self._read(dotted.replace(".", "/") + "/__init__.py") is not None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


@dataclass(frozen=True)
class Result:
    version: str
    path: str
    required: bool
    status: str  # "ok" | "missing" | "incompatible"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _params(fn: ast.AST) -> list[str]:
    a = fn.args  # type: ignore[attr-defined]
    return [p.arg for p in a.posonlyargs + a.args]


def _top(mod: ast.Module, name: str) -> Optional[ast.AST]:
    for node in mod.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _member(cls: ast.ClassDef, name: str) -> Optional[ast.AST]:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def _imported(src: Source, modname: str, mod: ast.Module, name: str) -> Optional[tuple[str, str]]:
    """Where ``name`` used in module ``modname`` comes from: (module, name) via ``from X import``."""
    pkg = modname if src.is_package(modname) else modname.rpartition(".")[0]
    for node in mod.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            base = pkg
            for _ in range(max(0, node.level - 1)):
                base = base.rpartition(".")[0]
            target = node.module or ""
            if node.level:
                target = f"{base}.{target}" if target else base
            return target, alias.name
    return None


def _find_class(src: Source, modname: str, name: str, depth: int = 0) -> Optional[tuple[str, ast.ClassDef]]:
    mod = src.module(modname)
    if mod is None or depth > MAX_BASE_DEPTH:
        return None
    node = _top(mod, name)
    if isinstance(node, ast.ClassDef):
        return modname, node
    imp = _imported(src, modname, mod, name)
    return _find_class(src, imp[0], imp[1], depth + 1) if imp else None


def _lookup(src: Source, modname: str, cls: ast.ClassDef, attr: str, depth: int = 0) -> Optional[ast.AST]:
    """Find ``attr`` on ``cls`` or, like Python's MRO (depth first), on its bases."""
    found = _member(cls, attr)
    if found is not None or depth > MAX_BASE_DEPTH:
        return found
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        hit = _find_class(src, modname, base.id)
        if hit is not None:
            found = _lookup(src, hit[0], hit[1], attr, depth + 1)
            if found is not None:
                return found
    return None


def resolve(src: Source, path: str) -> tuple[Optional[ast.AST], str]:
    """Resolve 'pkg.mod.Class.attr' (or 'pkg.mod.func') in ``src``; (node, why-not)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        modname = ".".join(parts[:i])
        mod = src.module(modname)
        if mod is None:
            continue
        rest = parts[i:]
        if len(rest) == 1:
            node = _top(mod, rest[0])
            return node, "" if node is not None else f"{rest[0]} not defined in {modname}"
        hit = _find_class(src, modname, rest[0])
        if hit is None:
            return None, f"class {rest[0]} not found in {modname}"
        cls_mod, cls = hit
        for name in rest[1:-1]:
            inner = _member(cls, name)
            if not isinstance(inner, ast.ClassDef):
                return None, f"{name} is not a class in {cls.name}"
            cls = inner
        node = _lookup(src, cls_mod, cls, rest[-1])
        return node, "" if node is not None else f"{cls.name}.{rest[-1]} not found (class or bases)"
    return None, f"no module of {path} in this release"


def check_target(src: Source, path: str, expected: tuple[str, ...], required: bool = True) -> Result:
    node, why = resolve(src, path)
    if node is None:
        return Result(src.version, path, required, "missing", why)
    if expected and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        found = _params(node)
        if found[: len(expected)] != list(expected):
            return Result(src.version, path, required, "incompatible",
                          f"expected leading parameters {expected}, found {tuple(found[:len(expected)])}")
    return Result(src.version, path, required, "ok")


def check(src: Source) -> list[Result]:
    out = [check_target(src, p, adapter.SIGNATURES.get(p, ()), True) for p in adapter.FRAMEWORK]
    out += [check_target(src, t.path, adapter.SIGNATURES.get(t.path, ()), t.required) for t in adapter.TARGETS]
    return out


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def calls_in_order(fn: ast.AST) -> list[str]:
    """Dotted names of every call inside ``fn``, in source order."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return [_dotted(n.func) for n in found]


def check_call_order(src: Source, path: str, order: tuple[str, ...]) -> Optional[Result]:
    """Does the method at ``path`` make the calls ``order`` in that order?  None when the method does
    not exist in this release (its targets' absence is in adapter.RELEASE_LIMITS)."""
    node, _ = resolve(src, path)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    i = 0
    for name in calls_in_order(node):
        if i < len(order) and (name == order[i] or name.endswith("." + order[i])):
            i += 1
    if i == len(order):
        return Result(src.version, f"calls of {path}", False, "ok")
    return Result(src.version, f"calls of {path}", False, "incompatible",
                  f"no call to {order[i]!r} after {list(order[:i])}")


def check_calls(src: Source) -> list[Result]:
    out = [check_call_order(src, p, order) for p, order in adapter.CALL_ORDER.items()]
    return [r for r in out if r is not None]


def cached_wheels(directory: str) -> dict[str, str]:
    """{version: wheel path} for every ``sglang-X-*.whl`` in ``directory``."""
    found = {}
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            m = _WHEEL_RE.match(name)
            if m:
                found[m.group(1)] = os.path.join(directory, name)
    return found


def installed_source() -> tuple[str, str]:
    """(directory holding ``sglang/``, version) of the installed SGLang, found without importing it."""
    from importlib.util import find_spec

    spec = find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("sglang is not installed")
    pkg_dir = list(spec.submodule_search_locations)[0]
    return os.path.dirname(pkg_dir), adapter.sglang_version() or "installed"


def failures(results: Iterable[Result]) -> list[Result]:
    return [r for r in results if r.required and not r.ok]


def format_results(results: list[Result]) -> str:
    lines = []
    for r in results:
        mark = "ok  " if r.ok else ("FAIL" if r.required else "opt ")
        lines.append(f"{r.version:>8}  {mark}  {r.path}" + (f"  ({r.status}: {r.detail})" if not r.ok else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_ctxprof.cli.compat", description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", default=".cache/wheels", help="directory of cached sglang-X wheels")
    ap.add_argument("--source", help="check this unpacked tree (a directory containing sglang/) instead")
    ap.add_argument("--installed", action="store_true", help="check the installed sglang instead")
    ns = ap.parse_args(argv)
    sources: dict[str, str] = {}
    if ns.source or ns.installed:
        loc, ver = (ns.source, "source") if ns.source else installed_source()
        if not os.path.isdir(os.path.join(loc, "sglang")):
            print(f"error: {loc} holds no sglang/ directory", file=sys.stderr)
            return 2
        sources[ver] = loc
    else:
        sources = cached_wheels(ns.wheels)
        if not sources:
            print(f"error: no sglang wheels in {ns.wheels}; run `make fetch-compat` first", file=sys.stderr)
            return 2
    bad = 0
    for ver, loc in sources.items():
        src = Source(loc, ver)
        try:
            res = check(src)
            calls = check_calls(src)
        finally:
            src.close()
        fails = failures(res)
        if calls:
            print(format_results(calls))
        supported = ver in adapter.SUPPORTED or ver in ("source", "installed")
        note = adapter.UNSUPPORTED.get(ver, "")
        print(format_results(res))
        verdict = "compatible" if not fails else ("INCOMPATIBLE" if supported else "unsupported (expected)")
        print(f"== sglang {ver}: {len(res) - len(fails)}/{len(res)} targets ok, {verdict}"
              + (f"; {note}" if note and fails else ""))
        if fails and supported:
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
