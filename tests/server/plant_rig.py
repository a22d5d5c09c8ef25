"""A real server with the test-only ``ctxprof_plant`` plugin (tests/plugins/ctxprof_plant) loaded.

The plugin is path-loaded (``conftest.path_loaded``): its folder and a dist-info entry point written
into the test's temp folder go on the server's ``PYTHONPATH`` ahead of the caller's own (so a
worktree's code still wins); nothing is installed.  The server reads its planted causes from ``plant.json`` in
that folder; ``plant(srv, **cfg)`` rewrites it between phases.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import ROOT, path_loaded, start_server

PLANT = ROOT / "tests" / "plugins" / "ctxprof_plant"


def planted_env(folder: Path, env: dict[str, str] | None = None) -> tuple[dict[str, str], Path]:
    """The server environment that loads the plant plugin from ``folder`` with nothing planted,
    and the ``plant.json`` it reads."""
    mod, loaded = path_loaded(PLANT, folder)
    plant_file = folder / "plant.json"
    plant_file.write_text("{}")
    return {**(env or {}), **loaded, mod.ENV: str(plant_file)}, plant_file


def start_planted(name: str, args: list[str], folder: Path, env: dict[str, str] | None = None):
    """Start ``args`` with the plant plugin loaded and nothing planted; the server gets
    ``plant_file`` and ``dir`` (``folder``) attributes."""
    full, plant_file = planted_env(folder, env)
    srv = start_server(name, args, env=full)
    srv.plant_file, srv.dir = plant_file, folder
    return srv


def plant(srv, **cfg) -> None:
    """Plant ``cfg`` (the plugin re-reads the file when its mtime changes); ``plant(srv)`` clears it."""
    srv.plant_file.write_text(json.dumps(cfg))
    time.sleep(0.05)
