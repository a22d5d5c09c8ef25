"""Every CLI command with its packages hidden: one ``error:`` line naming what to install, a
non-zero exit, never a traceback.

An import hook on ``sys.meta_path`` refuses the hidden top-level packages exactly as an environment
without them does (``ModuleNotFoundError`` with ``.name`` set), and already-imported copies are
taken out of ``sys.modules`` for the test, so the command's own lazy imports meet the refusal.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading

import pytest

from conftest import ROOT
from sglang_ctxprof.cli.main import SUBCOMMANDS, main
from http_fakes import FakeSGLang, QuietServer

FIXTURE = ROOT / "tests" / "fixtures" / "sweep"


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture
def hide(monkeypatch):
    def apply(*names: str) -> None:
        tops = set(names)
        for mod in list(sys.modules):
            if mod.split(".")[0] in tops:
                monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setattr(sys, "meta_path", [_Refuse(tops), *sys.meta_path])

    return apply


@pytest.fixture(scope="module")
def fake_url():
    srv = QuietServer(("127.0.0.1", 0), type("H", (FakeSGLang,), {"calls": 0}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _one_line(capsys, rc: int, expect: str) -> str:
    out = capsys.readouterr()
    assert rc != 0, out
    assert "Traceback" not in out.out + out.err, out.err
    errors = [ln for ln in out.err.splitlines() if "error:" in ln]
    assert len(errors) == 1, out.err
    assert expect in errors[0], errors[0]
    return errors[0]


# command -> (argv after the command name, packages hidden, what the line must name)
CASES = {
    "sweep": (["--ctx", "64", "--repeat", "1", "--short", "2", "--long", "8", "--out", "{tmp}/s"],
              ("rich",), "pip install sglang-ctxprof"),
    "report": ([str(FIXTURE / "baseline"), "--plots-dir", "{tmp}/r"], ("matplotlib",), "sglang-ctxprof[plots]"),
    "compare": ([str(FIXTURE / "baseline"), str(FIXTURE / "longer")], ("rich",), "pip install sglang-ctxprof"),
    # show, trace, diagnose, ui and capture need no package beyond the standard library: with everything optional
    # hidden they still reach the server (this fake has no /ctx_profile) and say so in their own line
    "show": (["--url", "{url}"], (), "/ctx_profile"),
    "trace": (["--url", "{url}", "nope"], (), "/ctx_profile"),
    "diagnose": (["--url", "{url}"], (), "/ctx_profile"),
    "ui": (["--url", "{url}", "--no-browser"], (), "/ctx_profile"),
    "capture": (["--url", "{url}", "--steps", "2"], (), "/ctx_profile"),
    "tiny-model": (["--arch", "llama", "--out", "{tmp}/m"], ("torch", "transformers"),
                   "sglang-ctxprof[instruments]"),
    "demo": (["--out", "{tmp}/d", "--models", "{tmp}/m"], ("sglang", "torch", "transformers"), "sglang-ctxprof[instruments]"),
    "patch": (["status"], ("sglang",), "sglang-ctxprof[instruments]"),
}


EXTRAS = ("matplotlib", "selenium", "grpc")  # the optional extras: hidden in every case
DEPENDENCIES = ("rich", "structlog", "opentelemetry")
INSTRUMENTED = ("sglang", "torch", "transformers")


def test_every_command_has_a_case():
    assert set(CASES) == set(SUBCOMMANDS)


@pytest.mark.parametrize("command", sorted(CASES))
def test_command_with_its_packages_hidden(command, hide, capsys, tmp_path, fake_url):
    args, hidden, expect = CASES[command]
    argv = [a.format(tmp=tmp_path, url=fake_url) for a in args]
    if command == "sweep":
        argv = ["--url", fake_url, *argv]
    if command in ("show", "trace", "diagnose", "ui", "capture"):
        hide(*EXTRAS, *DEPENDENCIES, *INSTRUMENTED)
        _one_line(capsys, main([command, *argv]), expect)
        return
    hide(*hidden, *EXTRAS)
    line = _one_line(capsys, main([command, *argv]), expect)
    assert any(repr(h) in line for h in hidden), line


def test_help_needs_no_optional_package(hide, capsys):
    hide("matplotlib", "selenium", "grpc", "sglang", "torch", "transformers")
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "tiny-model" in capsys.readouterr().out


def test_report_without_plots_needs_no_matplotlib(hide, capsys, tmp_path):
    hide("matplotlib")
    assert main(["report", str(FIXTURE / "baseline"), "--plots-dir", str(tmp_path), "--no-plots"]) == 0
    assert (tmp_path / "summary.csv").exists()


def test_import_failing_inside_an_installed_package_is_not_called_missing():
    """transformers raises ModuleNotFoundError without ``.name`` when a lazy class's import fails
    (e.g. a torchvision built for another torch): say the import failed, and why."""
    from sglang_ctxprof.cli.main import missing_package_line

    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as cause:
            raise ModuleNotFoundError("Could not import module 'DeepseekV3ForCausalLM'.") from cause
    except ModuleNotFoundError as exc:
        line = missing_package_line(exc)
    assert line == ("an import failed: Could not import module 'DeepseekV3ForCausalLM'. (RuntimeError: operator "
                    "torchvision::nms does not exist); the installed packages do not fit together")
    assert "is not installed" not in line
