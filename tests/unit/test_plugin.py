"""A bad SGLANG_CTXPROF_* value: one clear error in the launcher, the flag still parses, profiling
stays off in every process (the schedulers do not inherit the switch), SGLang serves as usual."""

from __future__ import annotations

import argparse
import logging
import os

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof import plugin


def test_bad_config_turns_profiling_off_with_one_clear_error(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(plugin, "_register_cli_hooks", lambda: calls.append("cli"))
    monkeypatch.setattr(plugin, "_BAD_CONFIG", None)
    monkeypatch.setattr("sys.argv", ["launch_server", names.CLI_FLAG])
    monkeypatch.setenv(names.ENV_BUCKETS, "fixed:zero")
    monkeypatch.setenv(names.ENV_ENABLE, "")  # recorded, so teardown restores the original state
    monkeypatch.delenv(names.ENV_ENABLE)
    with caplog.at_level(logging.ERROR):
        plugin.register()
    assert calls == ["cli"]  # the flag is still accepted by argparse
    assert "bad configuration, profiling is OFF" in caplog.text and "fixed:zero" in caplog.text
    assert names.ENV_ENABLE not in __import__("os").environ
    # after argument parsing the flag must not switch the schedulers back on
    plugin._keep_flag(argparse.Namespace(), argparse.Namespace(**{names.CLI_DEST: True}))
    assert names.ENV_ENABLE not in __import__("os").environ


def test_good_config_exports_the_switch(monkeypatch):
    monkeypatch.setattr(plugin, "_register_cli_hooks", lambda: None)
    monkeypatch.setattr(plugin, "_BAD_CONFIG", None)
    monkeypatch.setattr("sys.argv", ["launch_server", names.CLI_FLAG])
    monkeypatch.setattr("sglang_ctxprof.plugin.install_http_routes", lambda app=None: None)
    monkeypatch.setenv(names.ENV_ENABLE, "")  # recorded, so teardown removes what register() sets
    monkeypatch.setenv(names.ENV_SGLANG_APP_PATH, "")
    monkeypatch.delenv(names.ENV_SGLANG_APP_PATH)
    plugin.register()
    assert __import__("os").environ[names.ENV_ENABLE] == "1"


def test_register_writes_only_the_switch_and_the_app_path():
    """What register() exports is exactly the switch and the app path, so a test that records those
    two leaves the process as it found it (no order between tests is assumed)."""
    before = dict(os.environ)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugin, "_register_cli_hooks", lambda: None)
        mp.setattr(plugin, "_BAD_CONFIG", None)
        mp.setattr("sys.argv", ["launch_server", names.CLI_FLAG])
        mp.setattr("sglang_ctxprof.plugin.install_http_routes", lambda app=None: None)
        for key in (names.ENV_ENABLE, names.ENV_SGLANG_APP_PATH):
            mp.setenv(key, "")  # recorded, so the context's exit restores the original state
            mp.delenv(key)
        plugin.register()
        changed = {k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)}
        assert changed - {names.ENV_ENABLE, names.ENV_SGLANG_APP_PATH} == set()
        assert os.environ[names.ENV_ENABLE] == "1"
        assert os.environ[names.ENV_SGLANG_APP_PATH] == names.HTTP_APP_PATH
    assert dict(os.environ) == before
