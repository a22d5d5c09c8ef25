#!/usr/bin/env python3
"""The GPU run: SGLang 0.5.16 with CUDA graphs, EAGLE, the overlap scheduler and ctxprof, on one GPU.

    python3 bench/gpu_sglang/runner.py OUT [--dry] [--budget-s 470]

Started by ``run.sh`` (which installs the bundle first).  Stages, most important first, each with its
own time limit and try/except; ``OUT/results.json`` is rewritten after every stage, so a kill still
leaves what ran:

1. ``imports``    the server's modules with the bundle (each failure in one line);
2. ``server_graph`` SGLang with CUDA graphs (``--cuda-graph-max-bs-decode 16``), overlap on, EAGLE (3 steps,
   topk 1, 4 draft tokens), ``--enable-ctx-profile``, triton attention, pytorch sampling: start-up
   seconds and ``/ctx_profile/status`` (hooks, timing mode, the timed copies: shapes, capture s, bytes);
3. ``decode``     greedy requests at 64, 1024 and 4096 tokens of context (alone, then 4 together):
   every leaf phase > 0, leaves tile the step, per request steps == spec_verify_ct and
   1 + committed == completion_tokens, the timing label of each step (trace.json);
4. ``diagnosis``  ``/ctx_profile/diagnosis``: headline, verify attention's slope vs the HBM roofline;
5. ``ab``         decode tok/s with ctxprof enabled vs disabled (``POST /ctx_profile/disable``), batch 1
   and 16, interleaved ABBA, median pair ratio with a bootstrap 95% interval (bench/overhead.py), and
   the profiler's own cost line from the status;
6. ``eager``      a second server with ``--disable-cuda-graph``, the same prompts: the attention/MoE
   split measured eagerly against the timed copy's, with the gap per bucket;
7. ``drain``      bench/drain_gil.py on this host's cores (batch 1, 32 and 256): the scheduler loop's
   step-to-step delay with the recorder's drain thread (whole, paced) and with a drain process fed by
   a forwarding thread or by the scheduler thread itself; a 2-core CPU machine cannot tell whether a
   drain process helps where a spare core exists, this one can.  Twice: steps all CPU (``rows``),
   then GPU-bound steps, matmuls on the GPU and a synchronize (``gpu_rows``; ``--wait-ms`` models it
   under ``--dry``);
8. ``probe``      bench/gpu_probe.py (torch probe kit), merged into ``OUT/probes.json``.

``--dry`` (or DRY=1) runs the same stage logic against a canned server (no GPU, no SGLang): what
``tests/unit/test_gpu_sglang_dryrun.py`` runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
T0 = time.time()

LEAVES_TOL = 1e-6
# The leaf phases every EAGLE step must show (> 0 ms); overhead and unattributed are reported, not required.
REQUIRED = ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend")
CONTEXTS = (64, 1024, 4096)
NEW_TOKENS = 64
IMPORTS = ["sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler", "sglang.srt.models.deepseek_v2",
           "sglang.srt.models.llama_eagle", "sglang.srt.speculative.eagle_worker_v2",
           "sglang.srt.speculative.eagle_draft_cuda_graph_runner", "sglang.srt.layers.attention.triton_backend",
           "sglang.srt.layers.moe.fused_moe_triton", "sglang.srt.layers.sampler",
           "sglang.srt.model_executor.model_runner", "sgl_kernel", "sglang_ctxprof.plugin"]


def log(msg: str) -> None:
    print(f"[runner {time.strftime('%H:%M:%S')} +{time.time() - T0:5.1f}s] {msg}", flush=True)


# ---- HTTP -------------------------------------------------------------------------------------------
def http(method: str, url: str, body=None, timeout: float = 120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw.decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Client:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, timeout: float = 60):
        return http("GET", self.url + path, timeout=timeout)

    def post(self, path: str, body=None, timeout: float = 300):
        return http("POST", self.url + path, body, timeout=timeout)


def prompt_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(10, 3999) for _ in range(n)]


def generate(cl: Client, ids: list[int], new: int = NEW_TOKENS) -> dict:
    st, out = cl.post("/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": new, "temperature": 0, "ignore_eos": True}})
    if st != 200 or not isinstance(out, dict):
        raise RuntimeError(f"/generate answered {st}: {str(out)[:1500]}")
    return out


# ---- checks on /ctx_profile (pure functions: the unit test feeds them canned bodies) -----------------
def bucket_checks(body: dict, moe: bool = True) -> dict:
    """Per bucket: phases' means, every leaf phase > 0, leaves == step."""
    leaves = list(body.get("leaf_phases") or [])
    out = {"leaf_phases": leaves, "buckets": [], "ok": bool(body.get("buckets")) and bool(leaves)}
    for b in body.get("buckets") or []:
        ph = b.get("phases") or {}
        missing = [p for p in REQUIRED if (moe or p != "verify_moe") and not (ph.get(p) or {}).get("mean_ms", 0) > 0]
        total = sum((ph.get(p) or {}).get("total_ms", 0.0) for p in leaves)
        step = (ph.get("step") or {}).get("total_ms", 0.0)
        tiles = abs(total - step) <= LEAVES_TOL * max(1.0, step)
        ok = not missing and tiles and step > 0
        out["ok"] = out["ok"] and ok
        out["buckets"].append({
            "label": b.get("label"), "steps": b.get("steps"), "mean_batch_size": b.get("mean_batch_size"),
            "accepted_per_step": b.get("accepted_per_step"),
            "mean_ms": {p: round(v.get("mean_ms", 0.0), 4) for p, v in ph.items() if isinstance(v, dict)},
            "leaves_total_ms": round(total, 4), "step_total_ms": round(step, 4),
            "every_leaf_positive": not missing, "missing": missing, "leaves_tile_step": tiles, "ok": ok})
    return out


def request_checks(cl: Client, outs: list[dict]) -> dict:
    rows, ok = [], bool(outs)
    for out in outs:
        mi = out.get("meta_info") or {}
        st, r = cl.get(f"/ctx_profile/requests/{mi.get('id')}")
        if st != 200 or not isinstance(r, dict):
            rows.append({"rid": mi.get("id"), "error": f"{st}: {str(r)[:300]}", "ok": False})
            ok = False
            continue
        good = r.get("steps") == mi.get("spec_verify_ct", 0) and 1 + r.get("committed", -99) == mi.get(
            "completion_tokens")
        ok = ok and good
        rows.append({"prompt_tokens": mi.get("prompt_tokens"), "completion_tokens": mi.get("completion_tokens"),
                     "spec_verify_ct": mi.get("spec_verify_ct"), "steps": r.get("steps"),
                     "committed": r.get("committed"), "ok": good})
    return {"ok": ok, "requests": rows}


def timing_labels(cl: Client, sample_every: int) -> dict:
    """Count the timing label of each decode step in trace.json; sampled steps should read
    ``cuda_graph_events``, the others ``cuda_graph`` (a step at a shape with no graph: ``eager``...)."""
    st, tr = cl.get("/ctx_profile/trace.json?last=2048", timeout=120)  # the most a rank keeps
    if st != 200:
        return {"ok": False, "error": f"trace.json {st}: {str(tr)[:300]}"}
    events = tr.get("traceEvents", tr) if isinstance(tr, dict) else tr
    labels: dict[str, int] = {}
    for e in events or []:
        if isinstance(e, dict) and e.get("name") == "decode step":
            lab = (e.get("args") or {}).get("timing", "")
            labels[lab] = labels.get(lab, 0) + 1
    n = sum(labels.values())
    ev = labels.get("cuda_graph_events", 0)
    ok = n > 0 and ev > 0 and labels.get("cuda_graph", 0) > 0
    return {"ok": ok, "decode_steps": n, "labels": labels, "sample_every": sample_every,
            "expected_sampled_about": round(n / sample_every, 1) if sample_every else None}


def split_of(body: dict) -> dict:
    """verify attention / MoE / rest per bucket (ms), and attention's share of attn + MoE."""
    out = {}
    for b in body.get("buckets") or []:
        ph = b.get("phases") or {}
        a = (ph.get("verify_attn") or {}).get("mean_ms", 0.0)
        m = (ph.get("verify_moe") or {}).get("mean_ms", 0.0)
        out[b.get("label")] = {"verify_attn_ms": a, "verify_moe_ms": m,
                               "verify_rest_ms": (ph.get("verify_rest") or {}).get("mean_ms", 0.0),
                               "verify_ms": (ph.get("verify") or {}).get("mean_ms", 0.0),
                               "attn_share": a / (a + m) if a + m > 0 else None}
    return out


def split_gap(graph: dict, eager: dict) -> dict:
    rows = {}
    for label in sorted(set(graph) & set(eager), key=str):
        g, e = graph[label], eager[label]
        rows[label] = {
            "graph": g, "eager": e,
            "attn_ratio_graph_over_eager": g["verify_attn_ms"] / e["verify_attn_ms"] if e["verify_attn_ms"] else None,
            "moe_ratio_graph_over_eager": g["verify_moe_ms"] / e["verify_moe_ms"] if e["verify_moe_ms"] else None,
            "attn_share_gap": (g["attn_share"] - e["attn_share"])
            if g["attn_share"] is not None and e["attn_share"] is not None else None}
    return rows


def decode_run(cl: Client, contexts=CONTEXTS, new: int = NEW_TOKENS, together: int = 4) -> list[dict]:
    outs = [generate(cl, prompt_ids(n, seed=n), new) for n in contexts]
    with cf.ThreadPoolExecutor(together) as ex:  # requests of different lengths sharing batches
        futs = [ex.submit(generate, cl, prompt_ids(n, seed=1000 + i), new)
                for i, n in enumerate([contexts[i % len(contexts)] for i in range(together)])]
        outs += [f.result() for f in futs]
    return outs


def status_of(cl: Client) -> dict:
    st, body = cl.get("/ctx_profile/status")
    if st != 200 or not isinstance(body, dict):
        return {"error": f"{st}: {str(body)[:500]}"}
    return body


def rank_status(status: dict) -> dict:
    ranks = status.get("ranks") or []
    return ((ranks[0] or {}).get("status") or {}) if ranks else status


# ---- servers ----------------------------------------------------------------------------------------
def server_args(model: str, graphs: bool) -> list[str]:
    a = ["--model-path", f"{model}/target", "--speculative-algorithm", "EAGLE",
         "--speculative-draft-model-path", f"{model}/draft-eagle", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
         "--attention-backend", "triton", "--speculative-draft-attention-backend", "triton",
         "--moe-runner-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
         "--mem-fraction-static", "0.25", "--max-total-tokens", "131072", "--max-running-requests", "16",
         "--enable-ctx-profile", "--skip-server-warmup", "--log-level", "info"]
    # decode graphs on (the target-verify and draft graphs); prefill graphs (piecewise, torch.compile) off
    a += ["--cuda-graph-max-bs-decode", "16", "--disable-prefill-cuda-graph"] if graphs else ["--disable-cuda-graph"]
    return a


class Server:
    """SGLang in its own process group (ServerProcess from the CLI, with the GPU environment)."""

    def __init__(self, args: list[str], log_path: str, timeout: float, env: dict) -> None:
        from sglang_ctxprof.cli.server import ServerProcess
        self.sp = ServerProcess(args, log_path=log_path, timeout=timeout, python=sys.executable)
        self.sp.env = env  # ServerProcess adds the CPU engine variables; not here
        self.cmd = " ".join(self.sp.cmd)

    def start(self) -> Client:
        self.sp.start()
        return Client(self.sp.url)

    @property
    def startup_s(self):
        return self.sp.startup_s

    def stop(self) -> None:
        self.sp.stop(timeout=10)


def server_env() -> dict:
    env = dict(os.environ)
    for k in ("SGLANG_USE_CPU_ENGINE",):
        env.pop(k, None)
    env.setdefault("SGLANG_IS_FLASHINFER_AVAILABLE", "false")
    env.setdefault("SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY", "8")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---- the run ----------------------------------------------------------------------------------------
class Run:
    def __init__(self, out: Path, budget_s: float, dry: bool) -> None:
        self.out = out
        self.budget_s = budget_s
        self.dry = dry
        self.results: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "dry": dry, "budget_s": budget_s, "stages": {}}
        self.partial: dict[str, Any] = {}  # what the running stage has finished so far (kept if it times out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.write()

    def left(self) -> float:
        return self.budget_s - (time.time() - T0)

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.time() - T0, 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.out / "results.json")

    def stage(self, name: str, fn: Callable[[], dict], need_s: float, limit_s: float) -> dict | None:
        if self.left() < need_s:
            self.results["stages"][name] = {"skipped": f"{self.left():.0f} s left, needs {need_s:.0f} s"}
            log(f"stage {name}: SKIPPED ({self.left():.0f} s left < {need_s:.0f} s)")
            self.write()
            return None
        log(f"stage {name}: start (limit {limit_s:.0f} s, {self.left():.0f} s left)")
        t = time.time()
        res: dict
        self.partial = part = {}
        ex = cf.ThreadPoolExecutor(1)  # not a with-block: a stage past its limit is left behind
        fut = ex.submit(fn)
        limit = min(limit_s, max(5.0, self.left()))
        try:
            res = fut.result(timeout=limit)
        except cf.TimeoutError:  # what the stage finished before its limit stays
            res = {"ok": False, "error": f"timed out after {limit:.0f} s", **({"partial": dict(part)} if part else {})}
        except (SystemExit, KeyboardInterrupt):  # SIGTERM (``_terminated``) or ^C: the run stops here
            res = {"ok": False, "error": "stopped by a signal while it ran"}
            ex.shutdown(wait=False, cancel_futures=True)
            self.results["stages"][name] = res
            self.write()
            raise
        except BaseException as exc:  # noqa: BLE001 - every stage reports, the run goes on
            res = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-3000:]}",
                   "traceback": traceback.format_exc()[-4000:]}
        ex.shutdown(wait=False, cancel_futures=True)
        res["seconds"] = round(time.time() - t, 1)
        self.results["stages"][name] = res
        self.write()
        log(f"stage {name}: {'ok' if res.get('ok') else 'NOT OK'} in {res['seconds']} s"
            + (f" - {res.get('error', '')[:300]}" if not res.get("ok") else ""))
        return res


def imports_stage(pythonpath: str) -> dict:
    code = ("import importlib,sys,json\nres={}\n"
            f"for m in {IMPORTS!r}:\n"
            "    try:\n        importlib.import_module(m); res[m]='ok'\n"
            "    except BaseException as e:\n        res[m]=f'{type(e).__name__}: {e}'[:400]\n"
            "print('IMPORTS'+json.dumps(res))\n")
    env = {**server_env(), "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("IMPORTS")), None)
    res = json.loads(line[len("IMPORTS"):]) if line else {}
    for m, v in res.items():
        log(f"  import {m}: {v}")
    return {"ok": bool(res) and all(v == "ok" for v in res.values()), "modules": res,
            "stderr_tail": done.stderr[-1500:] if not line or done.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dry", action="store_true", default=os.environ.get("DRY") == "1")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", "470")))
    ap.add_argument("--model", default=os.environ.get("CTXPROF_GPU_MODEL"),
                    help="the tiny model folder (target/, draft-eagle/); default WORK/model/dsv3-eagle")
    ap.add_argument("--work", default=os.environ.get("CTXPROF_GPU_WORK", "/tmp/ctxprof-gpu"))
    ap.add_argument("--pairs", type=int, default=int(os.environ.get("AB_PAIRS", "6")))
    ap.add_argument("--skip", default=os.environ.get("SKIP", ""), help="comma list of stages to skip")
    ap.add_argument("--cpu", action="store_true", default=os.environ.get("CPU") == "1",
                    help="rehearsal on a CPU host: the real server from the bundle with the CPU shim (cpu_args)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    a.model = a.model or str(Path(a.work) / "model" / "dsv3-eagle")
    out = Path(a.out)
    run = Run(out, a.budget_s, a.dry)
    skip = set(filter(None, a.skip.split(",")))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    pythonpath = os.environ.get("PYTHONPATH", "")
    sample_every = int(server_env()["SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY"])
    run.results["env"] = env_info(a.dry)
    run.write()
    sys.path.insert(0, str(ROOT / "bench"))
    import overhead  # bench/overhead.py: the A/B logic (window, ab_at, summarize)

    if a.dry:
        from dry_server import DryServer  # bench/gpu_sglang/dry_server.py
        make_server = (lambda args, name, timeout: DryServer(args, graphs="--disable-cuda-graph" not in args))
    else:
        env = server_env()
        if a.cpu:
            from sglang_ctxprof.cli.server import CPU_ENV, cpu_args
            env.update(CPU_ENV)

        def make_server(args, name, timeout):
            if a.cpu:  # the CPU recipe instead of the GPU flags (rehearsal only)
                args = cpu_args(f"{a.model}/target", algorithm="EAGLE", draft=f"{a.model}/draft-eagle") + [
                    "--enable-ctx-profile", "--grammar-backend", "none"]
            return Server(args, str(work / f"server-{name}.log"), timeout, env)

    state: dict[str, Any] = {}

    if "imports" not in skip:
        run.stage("imports", (lambda: {"ok": True, "modules": {m: "ok (dry)" for m in IMPORTS}}) if a.dry
                  else (lambda: imports_stage(pythonpath)), need_s=30, limit_s=240)

    def start(name: str, graphs: bool, timeout: float) -> dict:
        srv = make_server(server_args(a.model, graphs), name, timeout)
        state[name] = srv
        log(f"  {srv.cmd}")
        cl = srv.start()
        state[name + "_client"] = cl
        st = status_of(cl)
        r0 = rank_status(st)
        split = r0.get("split") or {}
        return {"ok": bool(r0.get("enabled")), "startup_s": round(srv.startup_s or 0, 1), "cmd": srv.cmd,
                "timing": r0.get("timing"), "split_mode": split.get("mode"),
                "timed_copies": split.get("timed_copies"), "hooks": r0.get("hooks"),
                "coverage": r0.get("coverage"), "status": st}

    def decode() -> dict:
        cl = state["graph_client"]
        cl.post("/ctx_profile/reset")
        outs = decode_run(cl, contexts=CONTEXTS[:2] if a.cpu else CONTEXTS, new=24 if a.cpu else NEW_TOKENS)
        st, body = cl.get("/ctx_profile")
        if st != 200:
            return {"ok": False, "error": f"/ctx_profile {st}: {str(body)[:500]}"}
        state["graph_profile"] = body
        bc = bucket_checks(body)
        rq = request_checks(cl, outs)
        tl = timing_labels(cl, sample_every)
        for b in bc["buckets"]:
            log(f"  bucket {b['label']}: steps {b['steps']}, step {b['mean_ms'].get('step')} ms, "
                f"leaves ok {b['leaves_tile_step']}, all > 0 {b['every_leaf_positive']} {b['missing'] or ''}")
        log(f"  requests reconcile: {rq['ok']}; timing labels {tl.get('labels')}")
        return {"ok": bc["ok"] and rq["ok"] and tl["ok"], "profile_timing": body.get("timing"),
                "dropped": body.get("dropped"), "buckets": bc, "requests": rq, "timing_labels": tl,
                "split_graph": split_of(body), "status_after": rank_status(status_of(cl))}

    def diagnosis() -> dict:
        cl = state["graph_client"]
        st, d = cl.get("/ctx_profile/diagnosis")
        if st != 200 or not isinstance(d, dict):
            return {"ok": False, "error": f"{st}: {str(d)[:500]}"}
        phys = d.get("physics") or {}
        log(f"  headline: {d.get('headline')}")
        return {"ok": bool(d.get("headline")), "headline": d.get("headline"), "physics": phys,
                "phases": d.get("phases"), "flags": d.get("flags"), "diagnosis": d}

    def ab() -> dict:
        part = run.partial  # this stage's own (a thread left behind past its limit never writes the next's)
        cl = state["graph_client"]
        ns = argparse.Namespace(pairs=a.pairs, order="ABBA", requests=None, prompt=256, max_new_tokens=48)
        overhead.window(cl.url, 2, 2, 256, 16, seed=1)
        by = {}
        for k, conc in enumerate(int(c) for c in os.environ.get("AB_CONC", "1,16").split(",")):
            if run.left() < 60:
                by[str(conc)] = {"skipped": "time"}
                continue
            s = overhead.ab_at(cl.url, ns, conc, seed0=(k + 1) * 1000)
            log("  " + s["verdict"])
            by[str(conc)] = part[str(conc)] = s
        overhead.toggle(cl.url, True)
        r0 = rank_status(status_of(cl))
        return {"ok": all("median" in v for v in by.values()), "concurrency": by, "cost": r0.get("cost"),
                "split_status": r0.get("split"), "bar": overhead.BAR,
                "sample_every": sample_every}

    def stop(name: str) -> None:
        srv = state.pop(name, None)
        if srv is not None:
            srv.stop()

    def eager() -> dict:
        stop("graph")
        r = start("eager", graphs=False, timeout=max(30.0, min(240.0, run.left() - 40)))
        cl = state["eager_client"]
        cl.post("/ctx_profile/reset")
        decode_run(cl)
        st, body = cl.get("/ctx_profile")
        if st != 200:
            return {"ok": False, "error": f"/ctx_profile {st}"}
        ge = split_of(state.get("graph_profile") or {})
        ee = split_of(body)
        gap = split_gap(ge, ee)
        for label, g in gap.items():
            log(f"  bucket {label}: attn graph/eager {g['attn_ratio_graph_over_eager']}, "
                f"moe graph/eager {g['moe_ratio_graph_over_eager']}, share gap {g['attn_share_gap']}")
        stop("eager")
        return {"ok": bool(gap), "startup_s": r["startup_s"], "timing": body.get("timing"),
                "split_eager": ee, "gap": gap, "eager_buckets": bucket_checks(body)}

    def drain() -> dict:
        part = run.partial  # this stage's own, as ab()'s
        out: dict = {"cpus": os.cpu_count()}
        end = time.time() + min(190.0, run.left() - 10)  # inside the stage's own limit (200 s): no run outlives it
        small = ["--batches", "1", "--window", "10", "--rounds", "2"]
        for key, args, share in (
                ("rows", small + ["--ops", "20"] if a.dry else ["--batches", "1", "32", "256", "--window", "60",
                                                                "--rounds", "4"], 0.5),
                ("gpu_rows", small + ["--ops", "5", "--wait-ms", "5"] if a.dry else
                 ["--batches", "1", "32", "256", "--window", "40", "--rounds", "2", "--device", "cuda",
                  "--ops", "20", "--op-us", "1000"], 1.0)):
            js = work / f"drain_gil_{key}.json"
            try:  # a run past its share is killed (what it wrote stays); the next still runs
                done = subprocess.run([sys.executable, str(ROOT / "bench/drain_gil.py"), *args, "--json", str(js)],
                                      capture_output=True, text=True, timeout=max(5, share * (end - time.time())))
            except subprocess.TimeoutExpired as exc:
                done = subprocess.CompletedProcess(exc.cmd, "timeout", _text(exc.stdout), _text(exc.stderr))
            rows = json.loads(js.read_text())["rows"] if js.exists() else []
            for r in rows:
                log(f"  {key} batch {r['batch']} {r['mode']}: delay p50 {r['p50_delay_pct']:.2f}% "
                    f"p99 {r['p99_delay_pct']:.2f}%, GIL p50 {r['gil_p50_pct']:.2f}% p99 {r['gil_p99_pct']:.2f}% "
                    f"(idle against idle: {r['gil_p99_floor_pct']:.2f}%; steps at its p99 in a drain-thread "
                    f"collection: {r['p99_steps_in_drain_gc'][0]} of {r['p99_steps_in_drain_gc'][1]}, p99 without "
                    f"them {r['gil_p99_no_drain_gc_pct']:.2f}%), {r['drain_us_per_record']:.0f} us/record")
            out[key] = part[key] = [{k: v for k, v in r.items() if k != "gc_ms"} for r in rows]
            out[f"{key}_rc"] = done.returncode
            out[f"{key}_tail"] = done.stdout[-1500:] + done.stderr[-1500:]
        out["ok"] = all(out[f"{k}_rc"] == 0 and out[k] for k in ("rows", "gpu_rows"))
        return out

    def probe() -> dict:
        pdir = work / "probe"
        cmd = [sys.executable, str(ROOT / "bench/gpu_probe.py"), str(pdir)] + (["--dry-run"] if a.dry else [])
        try:  # a kit past its time keeps the probes it finished (merged below, whatever the exit)
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10, run.left() - 10),
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(exc.cmd, "timeout", _text(exc.stdout), _text(exc.stderr))
        merged = {}
        for p in sorted(pdir.glob("*.json")):
            try:
                merged[p.stem] = json.loads(p.read_text())
            except ValueError:  # a probe killed mid-write
                merged[p.stem] = {"error": "unreadable (killed mid-write?)"}
        (out / "probes.json").write_text(json.dumps(merged, indent=1))
        return {"ok": done.returncode == 0, "rc": done.returncode, "probes": sorted(merged),
                "tail": done.stdout[-1500:] + done.stderr[-1500:]}

    try:
        if "server_graph" not in skip:
            r = run.stage("server_graph", lambda: start("graph", True, max(30.0, min(300.0, run.left() - 60))),
                          need_s=90, limit_s=320)
            if r and r.get("ok"):
                for name, fn, need, lim in (("decode", decode, 20, 150), ("diagnosis", diagnosis, 5, 30),
                                            ("ab", ab, 60, 200)):
                    if name not in skip:
                        run.stage(name, fn, need_s=need, limit_s=lim)
        if "eager" not in skip:
            run.stage("eager", eager, need_s=100, limit_s=300)
    finally:  # also on SIGTERM (``timeout``, the device tool): the servers go, their logs come back
        stop("graph")
        stop("eager")
        collect_logs(work, out)
    if "drain" not in skip:
        run.stage("drain", drain, need_s=60, limit_s=200)
    if "probe" not in skip:
        run.stage("probe", probe, need_s=60, limit_s=240)
    collect_logs(work, out)
    stages = run.results["stages"]
    run.results["summary"] = {k: ("skipped" if "skipped" in v else "ok" if v.get("ok") else "NOT OK")
                              for k, v in stages.items()}
    run.write()
    log(f"summary: {run.results['summary']}")
    return 0 if all(v.get("ok") or "skipped" in v for v in stages.values()) else 1


def env_info(dry: bool) -> dict:
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    if dry:
        return info
    try:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.is_available()
                    and torch.cuda.get_device_name(0))
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = repr(exc)
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,clocks.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        info["nvidia_smi"] = repr(exc)
    return info


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def collect_logs(work: Path, out: Path) -> None:
    """One file of server log tails (the device tool brings back 8 files at most)."""
    parts = []
    for p in sorted(work.glob("server-*.log")):
        lines = p.read_text(errors="replace").splitlines()
        errs = [ln for ln in lines if "Error" in ln or "Traceback" in ln or "ctxprof" in ln.lower()][-80:]
        parts.append(f"===== {p.name}: {len(lines)} lines; error/ctxprof lines:\n" + "\n".join(errs)
                     + f"\n===== {p.name}: last 250 lines\n" + "\n".join(lines[-250:]))
    (out / "server_logs.txt").write_text("\n\n".join(parts) if parts else "no server logs\n")


def _terminated(signum, frame) -> None:
    """SIGTERM raises in the main thread, so the ``finally`` that stops the servers (own process
    groups, which a kill of this process would leave holding the GPU) and saves their logs runs."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    try:
        rc = main()
    except SystemExit as exc:
        log(f"stopped: exit {exc.code}")
        rc = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # a stage thread left behind past its limit must not hold the exit
