"""The byte cap on a real server: 40 one-step captures under load, cap 2 MB (~65 kB each: 40 do not fit)."""
import os, shutil, sys, threading, time
sys.path.insert(0, "/work/main/tests")
from conftest import http, rand_ids
from sglang_ctxprof.cli.server import ServerProcess, cpu_args
from sglang_ctxprof.model import names
RUN = "/tmp/s20/cap/run"; CAP = RUN + "/captures"
shutil.rmtree(RUN, ignore_errors=True); os.makedirs(RUN)
H = {"Authorization": "Bearer k"}
env = {names.ENV_CAPTURE_DIR: CAP, names.ENV_CAPTURE_INTERVAL_S: "0", names.ENV_CAPTURE_STEPS: "1",
       names.ENV_CAPTURE_MAX_MB: "2"}
srv = ServerProcess(cpu_args("/work/main/.cache/models/deepseek-v3-nodraft/target") + [names.CLI_FLAG, "--admin-api-key", "k"],
                    env=env, log_path=RUN + "/server.log")
stop = threading.Event()
def load(seed):
    i = 0
    while not stop.is_set():
        i += 1
        http("POST", srv.url + "/generate", {"input_ids": rand_ids(100, seed=seed * 1000 + i),
             "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}})
srv.start()
try:
    ts = [threading.Thread(target=load, args=(k,), daemon=True) for k in (1, 2)]; [t.start() for t in ts]; time.sleep(3)
    n = 0
    while n < 40:
        s, b = http("POST", srv.url + names.ROUTE_CAPTURE, headers=H)
        if s != 200: time.sleep(0.3); continue
        n += 1; cid = b["captures"][0]["id"]; t0 = time.time()
        while time.time() - t0 < 60:
            _, st = http("GET", srv.url + names.ROUTE_STATUS)
            c = next((c for c in st["ranks"][0]["status"]["capture"]["captures"] if c["id"] == cid), None)
            if c is None or c["state"] in ("done", "failed", "deleted"): break
            time.sleep(0.2)
    time.sleep(1)
    _, st = http("GET", srv.url + names.ROUTE_STATUS); cs = st["ranks"][0]["status"]["capture"]
    files = os.listdir(CAP); du = sum(os.path.getsize(os.path.join(CAP, f)) for f in files)
    print("captures", n, "files on disk", len(files), "bytes on disk", du, "cap", 2 * 2**20, "| status lists",
          len(cs["captures"]), "bytes_kept", cs["bytes_kept"], "deleted", cs["deleted"])
finally:
    stop.set(); srv.stop()
