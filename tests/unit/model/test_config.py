"""model/config.py: every variable is checked once at start, and a bad value names its variable."""

from __future__ import annotations

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof.model.config import CtxProfConfig


@pytest.mark.parametrize("key, value", [
    (names.ENV_LOG_SUMMARY_S, "1e10"),  # past threading's longest wait: the summary thread would die
    (names.ENV_LOG_SUMMARY_S, "1e-9"),  # a busy loop in the scheduler's process
    (names.ENV_BUCKETS, "fixed:0"),
    (names.ENV_BUCKETS, "bogus"),
    (names.ENV_FAULT, "hoks"),  # a typo: no fault would ever fire, silently
    (names.ENV_LOG_FILE, "/nonexistent/dir/f.log"),
    (names.ENV_ALLOWED_HOSTS, "http://x/"),  # could never match a Host header
])
def test_a_bad_value_is_one_error_naming_its_variable(key, value):
    with pytest.raises(ValueError) as exc:
        CtxProfConfig.from_env({key: value})
    assert str(exc.value).startswith(key) and "\n" not in str(exc.value), exc.value


def test_good_values_are_read_as_meant(tmp_path):
    cfg = CtxProfConfig.from_env({names.ENV_LOG_SUMMARY_S: "0", names.ENV_LOG_FILE: "STDERR",
                                  names.ENV_FAULT: "runtime", names.ENV_ALLOWED_HOSTS: "Prof.Example.com, lab"})
    assert (cfg.logs.summary_s, cfg.logs.dest, cfg.fault) == (0.0, "stderr", "runtime")
    assert cfg.allowed_hosts == ("prof.example.com", "lab")
    cfg = CtxProfConfig.from_env({names.ENV_LOG_SUMMARY_S: "0.5", names.ENV_LOG_FILE: str(tmp_path / "ev.log"),
                                  names.ENV_FAULT: "hooks"})
    assert (cfg.logs.summary_s, cfg.logs.dest, cfg.fault) == (0.5, str(tmp_path / "ev.log"), "hooks")
