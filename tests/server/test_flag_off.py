""""flag off is truly off", on a real CPU server.

With the plugin installed and neither ``--enable-ctx-profile`` nor ``SGLANG_CTX_PROFILE`` given:

* inside the real scheduler process, no hook target carries our wrapper marker and no profiler
  exists (``SGLANG_CTXPROF_SELFCHECK`` makes the scheduler write what it sees; the same check on a
  profiling server sees the wrappers, so the check can tell the two apart);
* the greedy outputs equal those of a profiling server;
* no ``/ctx_profile`` route exists (404), and the server keeps generating.
"""

from __future__ import annotations

import pytest

import ctxprof_ref
from sglang_ctxprof.collect import adapter

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def off():
    return ctxprof_ref.flag_off()


@pytest.fixture(scope="module")
def on(off):
    return ctxprof_ref.flag_on()  # reuses the fault-isolation server's view when it ran


def test_no_hook_installed_in_scheduler(off):
    sc = off["selfcheck"]
    assert sc, "the scheduler wrote no self-check"
    for s in sc:
        assert s["profiler"] is False
        assert set(s["wrapped"]) == {t.path for t in adapter.TARGETS}
        wrapped = {k: v for k, v in s["wrapped"].items() if v}
        assert not wrapped, wrapped
        # the required targets exist in this SGLang (False, not None = "could not resolve")
        for t in adapter.TARGETS:
            if t.required:
                assert s["wrapped"][t.path] is False, t.path


def test_self_check_sees_hooks_when_on(on):
    """The same probe on a profiling server reports the wrappers: the check above can fail."""
    for s in on["selfcheck"]:
        assert s["profiler"] is True
        for t in adapter.TARGETS:
            if t.required:
                assert s["wrapped"][t.path] is True, t.path


def test_no_route(off):
    assert off["routes"] and all(code == 404 for code in off["routes"].values()), off["routes"]
    assert off["generate_after"] == 200


def test_same_greedy_outputs_as_flag_on(off, on):
    assert off["outputs"] == on["outputs"]
    assert all(len(o) > 0 for o in off["outputs"])


def test_no_ctxprof_log_lines(off):
    text = open(off["log"], errors="replace").read()
    assert "sglang-ctxprof" not in text
