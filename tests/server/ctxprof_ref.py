"""Reference runs shared by the fault-isolation and flag-off server tests.

One pytest session starts the flag-off reference server at most once: :func:`flag_off` starts it,
records the greedy outputs of :data:`PROMPTS`, what the scheduler's self-check saw (which hook
targets carry our wrapper marker) and the status of our routes, stops it and memoizes the result.
:func:`flag_on` is the same for a profiling server; a module that already runs such a server
hands its observations over with :func:`remember_flag_on`, so no extra server is started.

Every server here is the tiny DeepSeek-V3 (MLA + MoE) with the identity EAGLE head, greedy.
"""

from __future__ import annotations

import concurrent.futures as cf
import glob
import json
import os
import tempfile
import time

from conftest import ROOT, generate, http, path_loaded, rand_ids, start_server, tiny
from sglang_ctxprof.model import names
from sglang_ctxprof.cli.server import cpu_args

# (context length, max_new_tokens): short and long contexts, mixed output lengths.
PROMPTS = ((64, 24), (300, 17), (1000, 31), (2500, 12))

_MEMO: dict[str, dict] = {}


def model_args() -> list[str]:
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    return cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"])


def run_prompts(url: str, headers: dict | None = None, workers: int = 4) -> list[list[int]]:
    """Send :data:`PROMPTS` concurrently (they share batches) and return each output's token ids."""
    with cf.ThreadPoolExecutor(workers) as ex:
        futs = [ex.submit(generate, url, rand_ids(n, seed=7000 + n), mt, headers) for n, mt in PROMPTS]
        outs = [f.result() for f in futs]
    return [o["output_ids"] for o in outs]


def read_selfcheck(directory: str, timeout: float = 30.0) -> list[dict]:
    """Wait for the scheduler's ``selfcheck-<pid>.json`` files and return them."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        files = sorted(glob.glob(os.path.join(directory, "selfcheck-*.json")))
        if files:
            return [json.load(open(f)) for f in files]
        time.sleep(0.5)
    raise AssertionError(f"no selfcheck file appeared in {directory}")


def route_statuses(url: str) -> dict[str, int]:
    r = names.ROUTE
    return {
        f"GET {r}": http("GET", url + r)[0],
        f"GET {r}/status": http("GET", url + r + "/status")[0],
        f"GET {r}/requests": http("GET", url + r + "/requests")[0],
        f"POST {r}/reset": http("POST", url + r + "/reset", {})[0],
    }


SELFCHECK_PLUGIN = ROOT / "tests" / "plugins" / "ctxprof_selfcheck"


def selfcheck_env() -> tuple[str, dict]:
    """A fresh report directory, and the env that path-loads the test-only selfcheck plugin."""
    d = tempfile.mkdtemp(prefix="ctxprof-selfcheck-")
    ctxprof_selfcheck, env = path_loaded(SELFCHECK_PLUGIN, d)
    return d, {**env, ctxprof_selfcheck.ENV: d}


def flag_off() -> dict:
    """Plugin installed, flag absent: outputs, self-check, route statuses (one server per session)."""
    if "off" not in _MEMO:
        d, env = selfcheck_env()
        env[names.ENV_ENABLE] = ""  # make sure nothing in the test environment turns it on
        srv = start_server("flag-off", model_args(), env=env)
        try:
            outputs = run_prompts(srv.url)
            _MEMO["off"] = {"outputs": outputs, "selfcheck": read_selfcheck(d),
                            "routes": route_statuses(srv.url), "log": srv.log_path}
            _MEMO["off"]["generate_after"] = http("POST", srv.url + "/generate", {
                "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}})[0]
        finally:
            srv.stop()
    return _MEMO["off"]


def remember_flag_on(outputs: list[list[int]], selfcheck: list[dict]) -> None:
    _MEMO.setdefault("on", {"outputs": outputs, "selfcheck": selfcheck})


def flag_on() -> dict:
    """Outputs and self-check of a profiling server (reuses one a module already ran)."""
    if "on" not in _MEMO:
        d, env = selfcheck_env()
        srv = start_server("flag-on-ref", model_args() + [names.CLI_FLAG], env=env)
        try:
            remember_flag_on(run_prompts(srv.url), read_selfcheck(d))
        finally:
            srv.stop()
    return _MEMO["on"]
