#!/usr/bin/env python3
"""Manual check: a real CPU server with speculative decoding and ctxprof on the installed SGLang release.

Run it with the Python of a venv that holds the release to check, ctxprof and the CPU shim
(``pip install sglang==X -e . -e patches/sglang_cpu``), under the shared server lock::

    flock /tmp/ctxprof-server.lock /path/to/venv/bin/python bench/old_release_check.py

It builds the tiny DeepSeek-V3 with its identity EAGLE head (``sglang-ctxprof tiny-model``, with this
venv's transformers), starts SGLang with the CPU recipe (``cpu_args``: intel_amx attention, EAGLE 3
steps, topk 1, 4 draft tokens) and ``--enable-ctx-profile``, sends greedy requests one at a time and a
few at once, then reads ``/ctx_profile`` and checks what the server tests check on 0.5.23:

* every phase of an EAGLE step is present (> 0 ms) in every bucket, and the leaves add up to the step;
* per request: ``steps == spec_verify_ct`` and ``1 + committed == completion_tokens``;
* request-steps in the buckets equal the per-request sums; nothing dropped.

Prints the release, the server start-up time, a line per bucket and per check; exits 1 when a check
fails (the server log path is printed).  Not part of ``make test``: it needs a second venv.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from overhead import http  # noqa: E402  (bench/ is this script's folder: the A/B's JSON client)
from sglang_ctxprof.cli.server import ServerError, ServerProcess, cpu_args  # noqa: E402

PHASES = ("draft", "verify", "verify_attn", "verify_rest", "draft_extend")


def generate(url: str, n_prompt: int, seed: int, max_new_tokens: int) -> dict:
    rng = random.Random(seed)
    ids = [rng.randint(10, 3999) for _ in range(n_prompt)]
    status, out = http("POST", url + "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {str(out)[:2000]}")
    return out


def build_models(out: Path, arch: str) -> dict:
    cmd = [sys.executable, "-m", "sglang_ctxprof.cli.main", "tiny-model", "--arch", arch, "--draft", "eagle",
           "--high-acceptance", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CTXPROF_QUIET": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"tiny-model exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return {"target": str(out / "target"), "draft": str(out / "draft-eagle")}


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failed.append(what)


def check_profile(url: str, outs: list[dict], body: dict, moe: bool, check: Checks) -> None:
    check(body.get("enabled") is True and body.get("algorithms") == ["EAGLE"],
          f"profile enabled, algorithms {body.get('algorithms')}")
    buckets = body.get("buckets", [])
    check(bool(buckets), f"{len(buckets)} buckets")
    phases = PHASES + (("verify_moe",) if moe else ())
    for b in buckets:
        ph = b["phases"]
        missing = [p for p in phases if not ph.get(p, {}).get("mean_ms", 0) > 0]
        leaves = sum(ph[p]["total_ms"] for p in body["leaf_phases"] if p in ph)
        print(f"  bucket {b['label']:>10}: steps {b['steps']}, batch {b['mean_batch_size']:.2f}, "
              f"accepted/step {b['accepted_per_step']:.2f}, step {ph['step']['mean_ms']:.1f} ms = "
              + ", ".join(f"{p} {ph[p]['mean_ms']:.1f}" for p in phases if p in ph), flush=True)
        check(not missing, f"bucket {b['label']}: every phase > 0 ms (missing: {missing or 'none'})")
        check(abs(leaves - ph["step"]["total_ms"]) <= 1e-6 * max(1.0, ph["step"]["total_ms"]),
              f"bucket {b['label']}: leaf phases {leaves:.3f} ms == step {ph['step']['total_ms']:.3f} ms")
    total = 0
    for out in outs:
        mi = out["meta_info"]
        status, r = http("GET", f"{url}/ctx_profile/requests/{mi['id']}")
        if status != 200:
            check(False, f"request {mi['id']}: /ctx_profile/requests answered {status}: {r}")
            continue
        check(r["steps"] == mi.get("spec_verify_ct", 0) and 1 + r["committed"] == mi["completion_tokens"],
              f"request prompt {mi['prompt_tokens']}: steps {r['steps']} == spec_verify_ct "
              f"{mi.get('spec_verify_ct', 0)}, 1 + committed {r['committed']} == completion_tokens "
              f"{mi['completion_tokens']}")
        total += r["steps"]
    req_steps = sum(round(b["mean_batch_size"] * b["steps"]) for b in buckets)
    check(req_steps == total and total > 0, f"bucket request-steps {req_steps} == Σ spec_verify_ct {total}")
    check(body.get("dropped") == 0, f"dropped {body.get('dropped')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="deepseek-v3", choices=("deepseek-v3", "llama"))
    ap.add_argument("--ctx", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--log", default=None, help="server log (default: a file in the temp directory)")
    ap.add_argument("--timeout", type=float, default=420.0, help="server start-up limit, seconds")
    args = ap.parse_args(argv)

    import torch

    release = metadata.version("sglang")
    print(f"SGLang {release}, torch {torch.__version__}, transformers {metadata.version('transformers')}, "
          f"sglang-kernel {metadata.version('sglang-kernel')}, python {sys.executable}", flush=True)
    check = Checks()
    with tempfile.TemporaryDirectory(prefix=f"ctxprof-{release}-") as tmp:
        log = args.log or str(Path(tempfile.gettempdir()) / f"ctxprof-old-release-{release}.log")
        srv = None
        try:
            models = build_models(Path(tmp) / f"{args.arch}-eagle-ha", args.arch)
            server_args = cpu_args(models["target"], algorithm="EAGLE", draft=models["draft"])
            server_args += ["--enable-ctx-profile"]
            print("sglang.launch_server " + " ".join(server_args), flush=True)
            srv = ServerProcess(server_args, log_path=log, timeout=args.timeout, python=sys.executable)
            srv.start()
            print(f"server ready in {srv.startup_s:.1f} s (log {log})", flush=True)
            status, st = http("GET", srv.url + "/ctx_profile/status")
            print(f"/ctx_profile/status {status}: {json.dumps(st)[:1500]}", flush=True)
            t0 = time.time()
            outs = [generate(srv.url, n, seed=n, max_new_tokens=args.max_new_tokens) for n in args.ctx]
            with cf.ThreadPoolExecutor(3) as ex:  # requests of different lengths sharing batches
                futs = [ex.submit(generate, srv.url, n, 100 + i, mt)
                        for i, (n, mt) in enumerate([(100, 17), (600, 29), (300, 11)])]
                outs += [f.result() for f in futs]
            print(f"{len(outs)} requests in {time.time() - t0:.1f} s", flush=True)
            status, body = http("GET", srv.url + "/ctx_profile")
            check(status == 200, f"GET /ctx_profile -> {status}")
            if status == 200:
                check_profile(srv.url, outs, body, args.arch == "deepseek-v3", check)
        except (ServerError, RuntimeError, OSError) as exc:
            check(False, f"{type(exc).__name__}: {str(exc)[-3000:]}")
        finally:
            if srv is not None:
                srv.stop()
    print(f"SGLang {release}: {'PASS' if not check.failed else 'FAIL'} ({len(check.failed)} failed)", flush=True)
    return 0 if not check.failed else 1


if __name__ == "__main__":
    sys.exit(main())
