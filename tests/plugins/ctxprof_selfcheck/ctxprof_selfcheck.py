"""Test-only SGLang plugin: a scheduler process reports which hook targets carry our wrapper.

With ``SGLANG_CTXPROF_SELFCHECK=<dir>`` each scheduler process writes ``selfcheck-<pid>.json``
into ``<dir>`` every 2 s: for every adapter target, whether it is wrapped by ctxprof, and whether a
ctxprof session holds the hooks.  So a test proves "flag off installs nothing" (and "flag on
installs the hooks") from inside the real scheduler.  Path-loaded by the server tests
(``ctxprof_ref.selfcheck_env``); it ships nowhere and does nothing without the variable.
"""

from __future__ import annotations

import json
import os
import threading
import time

ENV = "SGLANG_CTXPROF_SELFCHECK"


def register() -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    from sglang_ctxprof.plugin import process_role

    if process_role() == "scheduler":
        threading.Thread(target=_loop, args=(directory,), name="ctxprof-selfcheck", daemon=True).start()


def _loop(directory: str) -> None:
    from sglang_ctxprof.collect import adapter, hooks
    from sglang_ctxprof.collect.instrumentor import is_wrapper, resolve

    while True:
        time.sleep(2.0)
        report = {}
        for t in adapter.TARGETS:
            try:
                report[t.path] = bool(is_wrapper(resolve(t.path)[2]))
            except Exception:  # noqa: BLE001 - a target this release lacks
                report[t.path] = None
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".selfcheck-{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "wrapped": report, "profiler": hooks.SESSION is not None}, f)
        os.replace(tmp, os.path.join(directory, f"selfcheck-{os.getpid()}.json"))
