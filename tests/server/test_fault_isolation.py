"""Fault isolation, on a real CPU server with EAGLE speculative decoding.

One profiling server is started with ``SGLANG_CTXPROF_FAULT=runtime`` (test only): the
``POST /ctx_profile/fault`` switch then breaks one of our components at a time - the hooks, the
recorder, the aggregator, the span exporter sink, the scheduler-side control handler and the HTTP
handler - while greedy requests of mixed lengths run concurrently.  For each component:

* every request succeeds and its output is identical to the flag-off reference server's;
* ``/ctx_profile`` (or, for a broken endpoint, its JSON error) shows ``degraded`` with the reason;
* the server log holds exactly one warning with a traceback for that component, however many
  steps ran after the failure;
* after healing (``{"component": ""}``) profiling records steps again.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time

import pytest

import ctxprof_ref
from conftest import http, start_server
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

COMPONENTS = ("hooks", "recorder", "aggregator", "exporter", "control", "http")


@pytest.fixture(scope="module")
def reference():
    return ctxprof_ref.flag_off()  # runs (and stops) the flag-off server before ours starts


@pytest.fixture(scope="module")
def server(reference):
    d, env = ctxprof_ref.selfcheck_env()
    env[names.ENV_FAULT] = "runtime"
    srv = start_server("fault-isolation", ctxprof_ref.model_args() + [names.CLI_FLAG, "--enable-metrics"], env=env)
    try:
        srv.selfcheck_dir = d
        yield srv
    finally:
        srv.stop()


def _fault(url: str, component: str) -> dict:
    status, body = http("POST", url + "/ctx_profile/fault", {"component": component})
    assert status == 200, body
    return body


def _warnings(log_path: str, component: str) -> list[int]:
    """Line numbers of our 'component failed' warnings for ``component``, each with a traceback."""
    lines = open(log_path, errors="replace").read().splitlines()
    pat = f"sglang-ctxprof: component '{component}' failed and is now disabled"
    hits = [i for i, ln in enumerate(lines) if pat in ln]
    for i in hits:
        assert any(ln.startswith("Traceback") for ln in lines[i + 1:i + 4]), lines[i:i + 4]
        assert any("InjectedFault" in ln for ln in lines[i + 1:i + 40])
    return hits


def _degraded_gauge(url: str) -> dict[str, float]:
    """``sglang_ctxprof_degraded`` by component, as SGLang's /metrics serves it."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(http("GET", url + "/metrics")[1]):
        for smp in fam.samples:
            if smp.name == names.METRIC_DEGRADED:
                out[smp.labels["component"]] = max(out.get(smp.labels["component"], 0.0), smp.value)
    return out


def _profile_during_traffic(url: str, stop_after: float) -> list[int]:
    codes = []
    t0 = time.time()
    while time.time() - t0 < stop_after:
        codes.append(http("GET", url + "/ctx_profile")[0])
        time.sleep(0.3)
    return codes


def test_healthy_profile_matches_flag_off(server, reference):
    """Before any fault: same greedy outputs as without the plugin, and our hooks are installed."""
    outs = ctxprof_ref.run_prompts(server.url)
    assert outs == reference["outputs"]
    sc = ctxprof_ref.read_selfcheck(server.selfcheck_dir)
    assert all(s["profiler"] for s in sc)
    assert any(v for s in sc for v in s["wrapped"].values())
    ctxprof_ref.remember_flag_on(outs, sc)  # test_flag_off compares against this server's view
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200 and body["degraded"] is None and body["totals"]["decode_steps"] > 0


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_fault_is_isolated(server, reference, component):
    url = server.url
    assert http("POST", url + "/ctx_profile/reset")[0] == 200
    _fault(url, component)
    with cf.ThreadPoolExecutor(2) as ex:
        gen = ex.submit(ctxprof_ref.run_prompts, url)
        polls = ex.submit(_profile_during_traffic, url, 3.0)
        outs = gen.result()
        codes = polls.result()
    # 0 failed requests, identical greedy outputs.
    assert outs == reference["outputs"]
    assert http("POST", url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})[0] == 200

    # The profile shows the degradation with its reason (a broken endpoint says so in its JSON error).
    status, body = http("GET", url + "/ctx_profile")
    assert isinstance(body, dict), body
    if component in ("hooks", "recorder", "aggregator", "exporter"):
        assert status == 200, body
        assert all(c in (200,) for c in codes), codes
    else:
        assert status == 503 and "error" in body, body
        assert all(c in (500, 503) for c in codes), codes
    reasons = [d["components"] for d in body["degraded"] or []]
    assert any(component in r and "InjectedFault" in r[component] for r in reasons), body["degraded"]
    if component == "hooks":  # hooks off from the first step on: nothing recorded
        assert body["totals"]["records"] == 0
    if component != "http":  # the scheduler's own components: its live gauge says so, records or not
        assert _degraded_gauge(url)[component] == 1.0
    else:  # the routes' own guard is the HTTP process's: no scheduler series claims it is healthy
        assert "http" not in _degraded_gauge(url)

    # Exactly one warning with a traceback for this component, although many steps/polls ran.
    deadline = time.time() + 10
    while not _warnings(server.log_path, component) and time.time() < deadline:
        time.sleep(0.5)
    assert len(_warnings(server.log_path, component)) == 1

    # Heal: no degradation, and profiling records steps again.
    _fault(url, "")
    assert http("POST", url + "/ctx_profile/reset")[0] == 200
    assert ctxprof_ref.run_prompts(url) == reference["outputs"]
    status, body = http("GET", url + "/ctx_profile")
    assert status == 200 and body["degraded"] is None, body
    assert body["totals"]["decode_steps"] > 0 and body["dropped"] == 0
    assert set(_degraded_gauge(url).values()) == {0.0}


def test_fault_switch_rejects_bad_component(server):
    status, body = http("POST", server.url + "/ctx_profile/fault", {"component": "nope"})
    assert status == 400 and "error" in body
    status, body = http("POST", server.url + "/ctx_profile/fault", ["x"])
    assert status == 400 and "error" in body


def test_one_warning_per_component_in_the_whole_log(server):
    text = open(server.log_path, errors="replace").read()
    found = re.findall(r"sglang-ctxprof: component '(\w+)' failed", text)
    assert sorted(found) == sorted(COMPONENTS), found
