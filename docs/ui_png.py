"""Re-take ``docs/ui.png``: the live page of a real CPU server, with the speculation ledger.

Not a test and not a benchmark: a recipe that shows the page as a user sees it.  Two real SGLang
servers of the demo's tiny DeepSeek-V3 (MLA + MoE) on the CPU, one with the identity EAGLE head, one
plain (the same arguments without ``--speculative-*``), started side by side; each warms up once,
then serves the same greedy requests at 64..., 1024... and 3072-token contexts; the plain server's
``/ctx_profile`` is registered with the speculative one (``POST /ctx_profile/plain``), and headless
Chromium (Debian's ``chromium`` + ``chromium-driver``, through selenium) loads
``/ctx_profile/ui`` of the speculative server and saves a full-page screenshot.

    SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 python docs/ui_png.py [--out docs/ui.png]

It prints the diagnosis's headline and ledger verdict beside the picture, so what the image says can
be checked against the JSON.  About 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CTXS = (80, 1100, 3000)  # prompt tokens: the 64-127, 1024-2047 and 2048-4095 buckets
NEW = 48


def _http(method: str, url: str, body: object = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _generate(url: str, n: int, seed: int, new: int = NEW) -> None:
    rng = random.Random(seed)
    _http("POST", url + "/generate", {"input_ids": [rng.randint(10, 3999) for _ in range(n)],
                                      "sampling_params": {"max_new_tokens": new, "temperature": 0,
                                                          "ignore_eos": True}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "ui.png"))
    ap.add_argument("--models", default=str(ROOT / ".cache" / "models"))
    ap.add_argument("--logs", default=str(ROOT / ".cache" / "ui-png"))
    ns = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from sglang_ctxprof.cli.server import ServerProcess, cpu_args
    from sglang_ctxprof.cli.sweep_arms import plain_args
    from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build
    from sglang_ctxprof.model import names

    os.environ.setdefault("CTXPROF_QUIET", "1")
    m = build(TinyModelArgs(arch="deepseek-v3", draft="eagle", high_acceptance=True,
                            out=os.path.join(ns.models, "deepseek-v3-eagle-ha")))
    sargs = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + [names.CLI_FLAG]
    Path(ns.logs).mkdir(parents=True, exist_ok=True)
    servers = {"spec": ServerProcess(sargs, log_path=os.path.join(ns.logs, "spec.log"), timeout=600),
               "plain": ServerProcess(plain_args(sargs), log_path=os.path.join(ns.logs, "plain.log"), timeout=600)}
    errors: list[BaseException] = []

    def start(s: ServerProcess) -> None:
        try:
            s.start()
        except BaseException as exc:  # noqa: BLE001 - reported after both finished
            errors.append(exc)

    ts = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]
        spec, plain = servers["spec"].url, servers["plain"].url
        for url in (spec, plain):
            _generate(url, 16, 0, 4)  # a fresh server's first request: not part of the picture
            _http("POST", url + names.ROUTE_RESET, {})
            for i, n in enumerate(CTXS):
                for rep in range(2):
                    _generate(url, n, 10 * i + rep)
        reg = _http("POST", spec + names.ROUTE_PLAIN + "?source=plain%20server%20(same%20model)",
                    _http("GET", plain + names.ROUTE))
        print(f"registered plain reference: {reg['steps']} steps in {', '.join(reg['buckets'])}", flush=True)
        d = _http("GET", spec + names.ROUTE_DIAGNOSIS)
        print("headline:", d["headline"], "\nledger:", d["ledger"].get("verdict") or d["ledger"].get("reason"),
              flush=True)
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium")
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--window-size=1400,1000", "--hide-scrollbars"):
            opts.add_argument(a)
        drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
        try:
            drv.get(spec + names.ROUTE_UI)
            t0 = time.time()
            while not drv.execute_script("return window.ctxprof && window.ctxprof.state.refreshes >= 1 "
                                         "&& window.ctxprof.state.ledger && window.ctxprof.state.ledger.available"):
                if time.time() - t0 > 60:
                    raise RuntimeError("the page never drew the ledger")
                time.sleep(0.3)
            drv.set_window_size(1400, drv.execute_script("return document.body.scrollHeight") + 140)
            drv.execute_script("window.scrollTo(0, 0)")
            time.sleep(1.0)
            drv.save_screenshot(ns.out)
        finally:
            drv.quit()
        print(f"wrote {ns.out}", flush=True)
        return 0
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
