"""Apply, revert and inspect the few SGLang source patches on an SGLang tree.

The patch files ship inside the package (``sglang_ctxprof/data/patches/``), so an installed wheel
finds them as a source checkout does.

Patches exist only for what hooks cannot do (see each file's header).  A patch file starts with a
plain-text header - ``sglang-ctxprof patch: NAME``, ``SGLang-Versions: X Y ...``, ``Why: ...`` -
followed by a ``-p1`` unified diff against the directory that holds ``sglang/`` (site-packages or an
unpacked wheel).  Both GNU ``patch`` and ``git apply`` skip the header.

Every operation first checks (``patch --dry-run``), so apply and revert are idempotent ("already
applied" / "not applied" are no-ops) and never leave a half-patched file; a patch meant for other
SGLang versions is refused with the reason from its header.  Nothing here imports SGLang.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PATCH_DIR = Path(__file__).resolve().parents[1] / "data" / "patches"

APPLIED, NOT_APPLIED, CONFLICT = "applied", "not applied", "does not apply"


class PatchError(Exception):
    """An expected failure (unknown patch, wrong version, conflicting tree): one clear line."""


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    versions: tuple[str, ...]
    why: str

    def applies_to(self, version: Optional[str]) -> bool:
        return version in self.versions


def load_patches(directory: Path = PATCH_DIR) -> list[Patch]:
    if not directory.is_dir():
        raise PatchError(f"no patches directory at {directory} (a broken sglang-ctxprof install: reinstall it)")
    out = []
    for path in sorted(directory.glob("*.patch")):
        head = path.read_text().split("\n--- ", 1)[0]
        m = re.search(r"^SGLang-Versions:\s*(.+)$", head, re.M)
        why = re.search(r"^Why:\s*(.+?)(?=^\w[\w-]*:|\Z)", head, re.M | re.S)
        if not m:
            raise PatchError(f"{path.name}: header lacks an 'SGLang-Versions:' line")
        out.append(Patch(path.stem, path, tuple(m.group(1).split()),
                         " ".join(why.group(1).split()) if why else ""))
    return out


def select(names: list[str] | None, directory: Path = PATCH_DIR) -> list[Patch]:
    patches = load_patches(directory)
    if not names:
        return patches
    by_name = {p.name: p for p in patches}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise PatchError(f"unknown patch(es): {', '.join(unknown)}; known: {', '.join(sorted(by_name))}")
    return [by_name[n] for n in names]


def installed_root() -> Path:
    """The directory that holds the installed ``sglang/`` package (found without importing it)."""
    from importlib.util import find_spec

    spec = find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this Python environment")
    return Path(list(spec.submodule_search_locations)[0]).parent


def tree_version(root: Path) -> Optional[str]:
    """SGLang version of the tree at ``root`` from ``sglang/_version.py`` (no import)."""
    f = Path(root) / "sglang" / "_version.py"
    if not f.is_file():
        return None
    m = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", f.read_text(), re.M)
    return m.group(1) if m else None


def _patch_cmd(root: Path, patch: Patch, *, reverse: bool, dry_run: bool) -> subprocess.CompletedProcess:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed (apt-get install patch)")
    cmd = [exe, "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-r", "-", "-d", str(root),
           "-i", str(patch.path)]
    if reverse:
        cmd.append("--reverse")
    if dry_run:
        cmd.append("--dry-run")
    return subprocess.run(cmd, capture_output=True, text=True)


def git_apply_check(root: Path, patch: Patch, reverse: bool = False) -> subprocess.CompletedProcess:
    """``git apply --check`` of ``patch`` in ``root``, never inside an enclosing git repository."""
    exe = shutil.which("git")
    if exe is None:
        raise PatchError("git is not installed")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(root).resolve().parent))
    cmd = [exe, "apply", "--check", "-p1"] + (["--reverse"] if reverse else []) + [str(patch.path)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)


def status(root: Path, patch: Patch) -> str:
    if _patch_cmd(root, patch, reverse=False, dry_run=True).returncode == 0:
        return NOT_APPLIED
    if _patch_cmd(root, patch, reverse=True, dry_run=True).returncode == 0:
        return APPLIED
    return CONFLICT


def _check_version(root: Path, patch: Patch, force: bool) -> None:
    version = tree_version(root)
    if not force and not patch.applies_to(version):
        raise PatchError(f"{patch.name} is for SGLang {', '.join(patch.versions)}; this tree is "
                         f"{version or 'unknown'} (use --force to try anyway)")


def apply(root: Path, patch: Patch, *, dry_run: bool = False, force: bool = False) -> str:
    """Apply ``patch``; return what happened. Idempotent."""
    _check_version(root, patch, force)
    return _run(root, patch, reverse=False, dry_run=dry_run)


def revert(root: Path, patch: Patch, *, dry_run: bool = False) -> str:
    """Undo ``patch``; return what happened. Idempotent."""
    return _run(root, patch, reverse=True, dry_run=dry_run)


def _run(root: Path, patch: Patch, *, reverse: bool, dry_run: bool) -> str:
    done, verb = (NOT_APPLIED, "revert") if reverse else (APPLIED, "apply")
    st = status(root, patch)
    if st == done:
        return "not applied" if reverse else "already applied"
    if st == CONFLICT:
        raise PatchError(f"{patch.name} does not {verb} cleanly to {root}/sglang (locally modified, or another version)")
    if dry_run:
        return f"would {verb}"
    res = _patch_cmd(root, patch, reverse=reverse, dry_run=False)
    if res.returncode != 0:
        raise PatchError(f"{patch.name}: {verb} failed: {(res.stdout + res.stderr).strip()}")
    return "reverted" if reverse else "applied"
