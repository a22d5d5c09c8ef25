"""The shipped SGLang patches and ``sglang-ctxprof patch``: headers, dry runs per release, apply/revert cycle.

The installed SGLang is never modified: the apply/revert tests work on an overlay tree (symlinks to
the installed package, real copies of the patched folders) that is put first on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from sglang_ctxprof.cli import compat as compat_check, patching
from sglang_ctxprof.cli.main import main as cli

PATCHES = patching.load_patches()
WHEELS = compat_check.cached_wheels(str(ROOT / ".cache" / "wheels"))
INSTALLED = patching.installed_root()


def _touched(p: patching.Patch) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", p.path.read_text(), re.M)


def _overlay(tmp_path: Path, patches=PATCHES) -> Path:
    """tmp/sglang: symlinks to the installed package except real copies of the patched folders."""
    src = INSTALLED / "sglang"
    dst = tmp_path / "sglang"
    dst.mkdir()
    copied = {f.split("/")[1] for p in patches for f in _touched(p)}
    for entry in src.iterdir():
        if entry.name in copied:
            import shutil

            shutil.copytree(entry, dst / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dst / entry.name).symlink_to(entry)
    return tmp_path


def test_headers_name_versions_and_reason():
    assert {p.name for p in PATCHES} == {"serve-help-plugin-flags", "multi-tokenizer-app-path"}
    for p in PATCHES:
        assert p.versions and all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in p.versions), p
        assert len(p.why) > 80, p  # says why it exists
        assert _touched(p), p


def test_installed_tree_dry_run_and_git_check():
    version = patching.tree_version(INSTALLED)
    assert version == "0.5.23"
    for p in PATCHES:
        applies = p.applies_to(version)
        assert patching.status(INSTALLED, p) == (patching.NOT_APPLIED if applies else patching.CONFLICT), p.name
        assert (patching.git_apply_check(INSTALLED, p).returncode == 0) == applies, p.name


@pytest.mark.skipif(not WHEELS, reason="no wheels cached: run `make fetch-compat` (network)")
@pytest.mark.parametrize("version", sorted(WHEELS))
def test_each_cached_wheel(tmp_path, version):
    with zipfile.ZipFile(WHEELS[version]) as z:
        names = set(z.namelist())
        for p in PATCHES:
            for f in _touched(p) + ["sglang/_version.py"]:
                if f in names:
                    z.extract(f, tmp_path)
    assert patching.tree_version(tmp_path) == version
    for p in PATCHES:
        if not p.applies_to(version):
            continue
        assert patching.status(tmp_path, p) == patching.NOT_APPLIED, (version, p.name)
        assert patching.git_apply_check(tmp_path, p).returncode == 0, (version, p.name)
        assert patching.apply(tmp_path, p) == "applied"
        assert patching.git_apply_check(tmp_path, p, reverse=True).returncode == 0
        for f in _touched(p):
            compile((tmp_path / f).read_text(), f, "exec")  # patched file is valid Python
        assert patching.revert(tmp_path, p) == "reverted"


def test_cli_apply_is_idempotent_and_reversible(tmp_path, capsys):
    root = _overlay(tmp_path)
    target = root / "sglang" / "cli" / "serve.py"
    before = target.read_bytes()
    assert cli(["patch", "apply", "--dry-run", "--target", str(root)]) == 0
    assert "serve-help-plugin-flags: would apply" in capsys.readouterr().out
    assert target.read_bytes() == before
    assert cli(["patch", "apply", "--target", str(root)]) == 0
    assert cli(["patch", "apply", "--target", str(root)]) == 0
    out = capsys.readouterr().out
    assert "serve-help-plugin-flags: applied" in out and "already applied" in out
    assert "multi-tokenizer-app-path" not in out  # not for 0.5.23: skipped when no names are given
    assert cli(["patch", "status", "--target", str(root)]) == 0
    assert "serve-help-plugin-flags: applied (for this version)" in capsys.readouterr().out
    assert cli(["patch", "revert", "--target", str(root)]) == 0
    assert cli(["patch", "revert", "--target", str(root)]) == 0
    out = capsys.readouterr().out
    assert "reverted" in out and "not applied" in out
    assert target.read_bytes() == before


def test_cli_refuses_wrong_version_and_bad_input(tmp_path, capsys):
    root = _overlay(tmp_path)
    assert cli(["patch", "apply", "multi-tokenizer-app-path", "--target", str(root)]) == 2
    err = capsys.readouterr().err
    assert "is for SGLang 0.5.19, 0.5.20, 0.5.21, 0.5.22" in err and "Traceback" not in err
    assert cli(["patch", "apply", "nope", "--target", str(root)]) == 2
    assert "unknown patch" in capsys.readouterr().err
    assert cli(["patch", "status", "--target", str(tmp_path / "missing")]) == 2
    assert "holds no sglang/" in capsys.readouterr().err


def test_a_tree_whose_version_cannot_be_read_is_an_error_not_a_no_op(tmp_path, capsys):
    """Without a readable sglang/_version.py nothing says which patches the tree needs: apply and
    revert without names refuse (exit 2), naming the file; naming a patch with --force still works."""
    root = _overlay(tmp_path)
    version = root / "sglang" / "_version.py"
    version.unlink()  # a symlink to the installed file: replace the link, never write through it
    version.write_text("# no version here\n")
    assert cli(["patch", "apply", "--target", str(root)]) == 2
    err = capsys.readouterr().err
    assert "cannot read the SGLang version" in err and "_version.py" in err and "Traceback" not in err
    assert cli(["patch", "status", "--target", str(root)]) == 0
    assert "SGLang unknown" in capsys.readouterr().out


def _serve_help(root: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(root), SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1")
    env.pop("SGLANG_CTX_PROFILE", None)
    code = "import sys; from sglang.cli.main import main; sys.argv = ['sglang', 'serve', '--help']; main()"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert "Help for Standard Language Model Server" in out, out[-2000:]
    assert str(root) in subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__file__)"],
                                       env=env, capture_output=True, text=True).stdout
    return out


def test_serve_help_lists_flag_only_after_patch(tmp_path):
    root = _overlay(tmp_path)
    assert "--enable-ctx-profile" not in _serve_help(root)
    assert cli(["patch", "apply", "serve-help-plugin-flags", "--target", str(root)]) == 0
    out = _serve_help(root)
    assert "--enable-ctx-profile" in out and "GET /ctx_profile" in out
    assert cli(["patch", "revert", "serve-help-plugin-flags", "--target", str(root)]) == 0
