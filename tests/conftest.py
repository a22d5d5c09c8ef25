"""Shared test helpers: tiny-model cache, real-SGLang-server fixtures, small HTTP client.

Server tests start a real SGLang 0.5.23 on the CPU (``ServerProcess``); use one module-scoped
server per configuration (``make_server_fixture``) so at most one server runs at a time.
Models are built once into ``.cache/models`` (deterministic, no download).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = Path(os.environ.get("CTXPROF_MODEL_CACHE", ROOT / ".cache" / "models"))
LOG_DIR = Path(os.environ.get("CTXPROF_TEST_LOGS", ROOT / ".cache" / "test-logs"))


def tiny(arch: str, draft: str | None = None, high_acceptance: bool = False) -> dict[str, str]:
    from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build

    name = f"{arch}-{draft or 'nodraft'}{'-ha' if high_acceptance else ''}"
    os.environ.setdefault("CTXPROF_QUIET", "1")
    return build(TinyModelArgs(arch=arch, out=str(MODEL_CACHE / name), draft=draft,
                               high_acceptance=high_acceptance))


def write_dist_info(directory: str, module: str) -> str:
    """Write ``<module>-0.1.0.dist-info`` (METADATA + the ``sglang.srt.plugins`` entry point
    ``module:register``) into ``directory``; with it and the plugin's folder on ``PYTHONPATH``, SGLang
    loads a test plugin from tests/plugins without installing it.  Returns the folder."""
    d = os.path.join(directory, f"{module}-0.1.0.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1.0\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(f"[sglang.srt.plugins]\n{module} = {module}:register\n")
    return d


def path_loaded(plugin_dir: Path, folder: str | Path) -> tuple[ModuleType, dict[str, str]]:
    """Load the test-only plugin in ``plugin_dir`` (tests/plugins/<module>) into a server without
    installing it: import the module here (for its ``ENV`` names), write its entry point into
    ``folder``, and return the module and the server env whose ``PYTHONPATH`` is the plugin's folder,
    ``folder``, then the caller's own ``PYTHONPATH`` (a worktree's code still wins)."""
    sys.path.insert(0, str(plugin_dir))
    try:
        mod = importlib.import_module(plugin_dir.name)
    finally:
        sys.path.remove(str(plugin_dir))
    write_dist_info(str(folder), mod.__name__)
    path = os.pathsep.join(x for x in (str(plugin_dir), str(folder), os.environ.get("PYTHONPATH", "")) if x)
    return mod, {"PYTHONPATH": path}


def start_server(name: str, args: list[str], env: dict | None = None):
    from sglang_ctxprof.cli.server import ServerProcess

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    srv = ServerProcess(args, env=env, log_path=str(LOG_DIR / f"{name}.log"), timeout=600)
    srv.start()
    return srv


def http(method: str, url: str, body=None, headers: dict | None = None, timeout: float = 300):
    """Return (status, parsed JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def rand_ids(n: int, seed: int, vocab: int = 4000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(10, vocab - 1) for _ in range(n)]


def generate(url: str, ids: list[int], max_new_tokens: int = 32, headers: dict | None = None) -> dict:
    status, out = http("POST", url + "/generate", {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }, headers=headers)
    assert status == 200, out
    return out


def make_server_fixture(name: str, args_fn, env: dict | None = None, scope: str = "module"):
    """Build a pytest fixture that starts one real server for the module and stops it after."""

    @pytest.fixture(scope=scope)
    def _fixture():
        srv = start_server(name, args_fn(), env=env)
        try:
            yield srv
        finally:
            srv.stop()

    return _fixture
