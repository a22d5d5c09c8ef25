"""``conftest.path_loaded``: the one way server tests load a test-only plugin from tests/plugins
without installing it, and the three setups that use it (fault, selfcheck, plant)."""

from __future__ import annotations

import os

from conftest import ROOT

PLUGINS = ROOT / "tests" / "plugins"


def test_path_loaded_imports_the_plugin_writes_its_entry_point_and_keeps_the_callers_path(tmp_path, monkeypatch):
    from conftest import path_loaded

    monkeypatch.setenv("PYTHONPATH", "/the/worktree")
    mod, env = path_loaded(PLUGINS / "ctxprof_fault", tmp_path)
    assert mod.__name__ == "ctxprof_fault" and hasattr(mod, "register")
    eps = (tmp_path / "ctxprof_fault-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "ctxprof_fault = ctxprof_fault:register" in eps
    assert env == {"PYTHONPATH": f"{PLUGINS / 'ctxprof_fault'}:{tmp_path}:/the/worktree"}


def test_path_loaded_without_a_caller_path_adds_no_empty_entry(tmp_path, monkeypatch):
    from conftest import path_loaded

    monkeypatch.delenv("PYTHONPATH", raising=False)
    _, env = path_loaded(PLUGINS / "ctxprof_plant", tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PLUGINS / "ctxprof_plant"), str(tmp_path)]


def test_the_selfcheck_and_plant_servers_keep_the_worktrees_pythonpath(tmp_path, monkeypatch):
    """A worktree runs tests with PYTHONPATH=$PWD so its code wins over the editable install: a
    server env that drops it silently profiles another checkout's code."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "server"))
    import ctxprof_ref
    import plant_rig

    monkeypatch.setenv("PYTHONPATH", "/the/worktree")
    d, env = ctxprof_ref.selfcheck_env()
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/the/worktree"
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(PLUGINS / "ctxprof_selfcheck"), d]
    penv, plant_file = plant_rig.planted_env(tmp_path)
    assert penv["PYTHONPATH"].split(os.pathsep)[-1] == "/the/worktree"
    assert plant_file == tmp_path / "plant.json"
