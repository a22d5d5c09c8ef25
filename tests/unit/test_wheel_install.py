"""The sdist and wheel that ``python -m build`` makes work outside the checkout.

The wheel (built from the sdist, so the sdist is proven complete too) is installed, not editable,
into a fresh venv.  The venv sees this environment's big packages (SGLang, torch, matplotlib, ...)
through a ``.pth`` line pointing at a folder of links to them, with the editable ctxprof left out,
and pip runs with ``--no-index``: the install resolves every declared dependency from what is
there, or fails.  Every command then runs from a folder outside the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from http_fakes import FakeSGLang, QuietServer

FIXTURE = ROOT / "tests" / "fixtures" / "sweep" / "baseline"


def _run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (cmd, p.stdout[-3000:], p.stderr[-3000:])
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=tmp)
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    # the big packages of this environment, without ctxprof's own editable install
    base = tmp / "base"
    base.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        low = entry.name.lower()
        if not (low.startswith(("sglang_ctxprof", "__editable__")) or low.endswith(".pth")):
            (base / entry.name).symlink_to(entry)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp)
    py = venv / "bin" / "python"
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    Path(site, "_ctxprof_test_base.pth").write_text(f"{base}\n")
    _run([py, "-m", "pip", "install", "-q", "--no-index", wheels[0]], cwd=tmp)
    return {"tmp": tmp, "venv": venv, "py": py, "wheel": wheels[0], "script": venv / "bin" / "sglang-ctxprof"}


def test_wheel_ships_the_data(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert "sglang_ctxprof/data/patches/multi-tokenizer-app-path.patch" in names
    assert "sglang_ctxprof/data/patches/serve-help-plugin-flags.patch" in names
    assert any(n.startswith("sglang_ctxprof/data/corpus/") and n.endswith(".txt") for n in names)
    from sglang_ctxprof.views.ui import FILES

    for f in FILES:  # the live page and its vendored chart library, with its licence
        assert f"sglang_ctxprof/data/ui/{f}" in names, f
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [ln for ln in zipfile.ZipFile(installed["wheel"]).read(meta).decode().splitlines()
                if ln.startswith("Requires-Dist:")]
    for dep in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "structlog", "rich"):
        assert any(ln.split()[1].startswith(dep) and "extra ==" not in ln for ln in requires), requires
    assert any("sglang" in ln and 'extra == "instruments"' in ln for ln in requires), requires


def test_installed_package_is_the_wheel_and_finds_its_data(installed):
    code = ("import sglang_ctxprof, sglang_ctxprof.cli.patching as p, sglang_ctxprof.cli.prompts as pr;"
            "import sglang_ctxprof.views.ui as ui;"
            "print(sglang_ctxprof.__file__); print(len(p.load_patches())); print(len(pr.corpus_text()) > 1000);"
            "print(all(len(ui.read(f)) > 500 for f in ui.FILES))")
    out = _run([installed["py"], "-c", code], cwd=installed["tmp"]).stdout.split()
    assert out[0].startswith(str(installed["venv"])), out
    assert out[1:] == ["2", "True", "True"], out


def test_entry_point_loads_the_plugin(installed):
    code = ("from importlib.metadata import entry_points;"
            "eps = [e for e in entry_points(group='sglang.srt.plugins') if e.name == 'ctxprof'];"
            "f = eps[0].load(); import inspect; print(eps[0].value, inspect.getsourcefile(f))")
    value, path = _run([installed["py"], "-c", code], cwd=installed["tmp"]).stdout.split()
    assert value == "sglang_ctxprof.plugin:register" and path.startswith(str(installed["venv"]))


def test_cli_commands_from_the_wheel(installed):
    script, tmp = installed["script"], installed["tmp"]
    assert "tiny-model" in _run([script, "--help"], cwd=tmp).stdout
    srv = QuietServer(("127.0.0.1", 0), type("H", (FakeSGLang,), {"calls": 0}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        _run([script, "sweep", "--url", url, "--ctx", "64", "--repeat", "1", "--short", "2", "--long", "8",
              "--out", tmp / "sweep", "--no-plots"], cwd=tmp)
    finally:
        srv.shutdown()
        srv.server_close()
    assert list((tmp / "sweep").glob("point-*.json"))
    _run([script, "report", FIXTURE, "--plots-dir", tmp / "report"], cwd=tmp)
    assert (tmp / "report" / "decode_tok_s.png").stat().st_size > 0
    status = _run([script, "patch", "status"], cwd=tmp).stdout
    assert "serve-help-plugin-flags" in status and "multi-tokenizer-app-path" in status
