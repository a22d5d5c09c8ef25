"""A rid capture whose request never comes, on a real idle CPU server: does it still hold the one
capture after 70 s?  To try another tree's package, run it from that tree's folder with
PYTHONPATH=<tree> (SGLang starts with ``python -m``, which puts the folder it runs in first).  It asks
with the server's defaults only (the old tree has no wait_s).  before: fdb98a1; after: this session's."""
import os, shutil, sys, time
sys.path.insert(0, "/work/main/tests")
from conftest import http
from sglang_ctxprof.cli.server import ServerProcess, cpu_args
from sglang_ctxprof.model import names
import sglang_ctxprof
RUN = "/tmp/s21/pending/run"
shutil.rmtree(RUN, ignore_errors=True); os.makedirs(RUN)
H = {"Authorization": "Bearer k"}
print("package:", os.path.dirname(sglang_ctxprof.__file__))
srv = ServerProcess(cpu_args("/work/main/.cache/models/deepseek-v3-nodraft/target") + [names.CLI_FLAG, "--admin-api-key", "k"],
                    env={names.ENV_CAPTURE_DIR: RUN + "/captures", names.ENV_CAPTURE_INTERVAL_S: "0"},
                    log_path=RUN + "/server.log")
srv.start()
try:
    s, b = http("POST", srv.url + names.ROUTE_CAPTURE + "?rid=typo-never-sent", headers=H)
    print(f"t=0 s: POST capture?rid=typo-never-sent -> {s} {b.get('captures', [{}])[0].get('state') if s == 200 else b}")
    t0 = time.time()
    for at in (5, 30, 70):
        time.sleep(max(0.0, t0 + at - time.time()))
        s, b = http("POST", srv.url + names.ROUTE_CAPTURE + "?steps=2", headers=H)
        print(f"t={at} s: POST capture?steps=2 -> {s} {b.get('error') or b.get('captures', [{}])[0].get('id')}")
        if s == 200:
            break
    _, st = http("GET", srv.url + names.ROUTE_STATUS)
    for c in st["ranks"][0]["status"]["capture"]["captures"]:
        print(f"  {c['id']}: {c['state']} {c.get('error', '')}")
finally:
    srv.stop()
