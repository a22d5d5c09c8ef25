import json, os, sys, time, threading, urllib.request
sys.path.insert(0, sys.argv[1])
from sglang_ctxprof.cli.server import ServerProcess, cpu_args
from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build
cache = "/work/main/.cache/models/deepseek-v3-eagle-ha"
mdl = build(TinyModelArgs(arch="deepseek-v3", out=cache, draft="eagle", high_acceptance=True))
tidf = "/tmp/s/tid/tid.txt"
if os.path.exists(tidf): os.remove(tidf)
env = {"PYTHONPATH": "/tmp/s/tid:" + sys.argv[1], "CTXPROF_DRAIN_TID": tidf}
srv = ServerProcess(cpu_args(mdl["target"], algorithm="EAGLE", draft=mdl["draft"]) + ["--enable-ctx-profile", "--max-running-requests", "48"],
                    env=env, log_path="/tmp/s/tid/server.log", timeout=900)
srv.start()
HZ = os.sysconf("SC_CLK_TCK")
def cpu_s():
    tot = 0.0
    for line in open(tidf):
        pid, tid = line.split()
        try:
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            tot += (int(f[11]) + int(f[12])) / HZ
        except FileNotFoundError:
            pass
    return tot
def status():
    return json.loads(urllib.request.urlopen(srv.url + "/ctx_profile/status").read())["ranks"][0]["status"]
def gen(n):
    body = json.dumps({"text": "hello " * 50, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}).encode()
    urllib.request.urlopen(urllib.request.Request(srv.url + "/generate", data=body, headers={"Content-Type": "application/json"}), timeout=300).read()
gen(8)
time.sleep(2)
c0, t0 = cpu_s(), time.time(); time.sleep(30); c1, t1 = cpu_s(), time.time()
print(f"idle: drain thread CPU {1e3 * (c1 - c0) / (t1 - t0):.2f} ms per s", flush=True)
conc = int(sys.argv[2]); stop = time.time() + 30
def worker():
    while time.time() < stop: gen(256)
s0 = status()
c0, t0 = cpu_s(), time.time()
ts = [threading.Thread(target=worker) for _ in range(conc)]; [t.start() for t in ts]; [t.join() for t in ts]
c1, t1 = cpu_s(), time.time()
st = status()
n = st["submitted"] - s0["submitted"]
print(f"load c={conc}: {n / (t1 - t0):.1f} records per s; drain thread CPU {1e3 * (c1 - c0) / (t1 - t0):.2f} ms per s, "
      f"{1e6 * (c1 - c0) / max(1, n):.0f} us per record (/proc); self-reported {json.dumps(st['cost'])}", flush=True)
srv.stop()
