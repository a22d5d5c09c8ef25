"""Offline AST compatibility check (sglang_ctxprof.cli.compat).

Always runs against the installed SGLang source tree (0.5.23) and against small synthetic trees that
exercise each failure mode; runs against every wheel in .cache/wheels when `make fetch-compat` has
cached them (no network at test time).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from sglang_ctxprof.collect import adapter
from sglang_ctxprof.cli import compat as cc

WHEELS = cc.cached_wheels(str(ROOT / ".cache" / "wheels"))


def _tree(tmp_path: Path, files: dict[str, str]) -> cc.Source:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return cc.Source(str(tmp_path), "synthetic")


def test_installed_tree_resolves_every_target():
    loc, version = cc.installed_source()
    src = cc.Source(loc, version)
    res = cc.check(src)
    assert len(res) == len(adapter.TARGETS) + len(adapter.FRAMEWORK)
    assert cc.failures(res) == [], cc.format_results(cc.failures(res))
    # the optional MoE-block targets of the families we know exist in 0.5.23 too
    assert all(r.ok for r in res), cc.format_results([r for r in res if not r.ok])


def test_main_on_installed_tree_exits_zero(capsys):
    assert cc.main(["--installed"]) == 0
    out = capsys.readouterr().out
    assert "compatible" in out and "FAIL" not in out


def test_missing_renamed_and_inherited(tmp_path):
    src = _tree(tmp_path, {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/base.py": """
            class Base:
                def run_batch(self, batch, pp_proxy_tensors=None):
                    pass
        """,
        "sglang/srt/sched.py": """
            from .base import Base as _B

            class Scheduler(_B):
                def process_batch_result(self, model_batch, result):
                    pass
        """,
    })
    ok = cc.check_target(src, "sglang.srt.sched.Scheduler.run_batch", ("self", "batch"))
    assert ok.ok, ok  # found on the base class through a relative, aliased import
    bad = cc.check_target(src, "sglang.srt.sched.Scheduler.process_batch_result", ("self", "batch", "result"))
    assert bad.status == "incompatible" and "model_batch" in bad.detail
    gone = cc.check_target(src, "sglang.srt.sched.Scheduler.get_internal_state", ("self", "recv_req"))
    assert gone.status == "missing" and "get_internal_state" in gone.detail
    nomod = cc.check_target(src, "sglang.srt.nothere.X.f", ())
    assert nomod.status == "missing"
    nocls = cc.check_target(src, "sglang.srt.sched.Nope.f", ())
    assert nocls.status == "missing" and "Nope" in nocls.detail


def test_main_reports_no_wheels(tmp_path, capsys):
    assert cc.main(["--wheels", str(tmp_path)]) == 2
    assert "make fetch-compat" in capsys.readouterr().err


@pytest.mark.skipif(not WHEELS, reason="no wheels cached: run `make fetch-compat` (network)")
@pytest.mark.parametrize("version", sorted(WHEELS))
def test_cached_wheel(version):
    src = cc.Source(WHEELS[version], version)
    try:
        results = cc.check(src)
        fails = cc.failures(results)
    finally:
        src.close()
    if version in adapter.SUPPORTED:
        assert fails == [], cc.format_results(fails)
        # every optional target a supported release lacks is declared, with its effect, and no more
        missing = {r.path for r in results if not r.ok}
        assert missing == set(adapter.RELEASE_LIMITS.get(version, {})), cc.format_results(
            [r for r in results if not r.ok])
    elif version in adapter.UNSUPPORTED:
        # the declared reason names every required target that fails
        assert fails, f"{version} is declared unsupported but every target resolves"
        for f in fails:
            assert f.path.rsplit(".", 2)[-2] in adapter.UNSUPPORTED[version], f


def test_supported_range_is_every_release_since_the_framework():
    assert adapter.SUPPORTED[0] == "0.5.13" and adapter.SUPPORTED[-1] == "0.5.23"
    assert len(adapter.SUPPORTED) == 11 and "0.5.12" in adapter.UNSUPPORTED
    assert adapter.release_limits("0.5.23") == []
    assert any("overlap gate" in line for line in adapter.release_limits("0.5.14"))
    # graphs, eager fallback, FrozenKV MTP, overlap, no DFLASH / DSPARK / UNO worker yet, no send_abort_output
    assert len(adapter.release_limits("0.5.13")) == 8
    assert any("send_abort_output" in line for line in adapter.release_limits("0.5.22"))
    assert "the UNO worker does not exist yet" in adapter.release_limits("0.5.19")
    assert not any("DFLASH worker" in line for line in adapter.release_limits("0.5.14"))


def test_support_messages():
    assert adapter.support_message("0.5.23") is None
    msg = adapter.support_message("0.5.12")
    assert "not supported" in msg and "model_worker_batch" in msg
    assert "not a tested release" in adapter.support_message("0.6.0")
    old = adapter.support_message("0.4.10", has_framework=False)
    assert "no plugin framework" in old and "0.5.23" in old


def test_patch_status_names_a_release_without_plugins(tmp_path, capsys):
    from sglang_ctxprof.cli.main import main as cli

    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "_version.py").write_text("__version__ = version = '0.4.10.post2'\n")
    assert cli(["patch", "status", "--target", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SGLang 0.4.10.post2" in out and "has no plugin framework" in out
