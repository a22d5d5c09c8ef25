"""``sglang-ctxprof demo``: the whole story on this machine's CPU in a few minutes.

Builds the tiny DeepSeek-V3 (MLA + MoE, the Kimi-K2 architecture) with a draft, starts a real SGLang
server on the CPU with speculative decoding and ``--enable-ctx-profile``, sends greedy requests at
several context lengths, prints the server's per-phase breakdown by context, and stops the server
(no process left behind).

``--draft eagle`` (default) uses the identity EAGLE head on a pure-bigram target for realistic
acceptance (~3.7 of 4); ``--draft eagle3`` runs the Kimi-K2-style EAGLE-3 path (acceptance ~1).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request

from .server import ServerProcess, cpu_args
from .tiny_model import TinyModelArgs, build


def add_cli_args(ap) -> None:
    ap.add_argument("--draft", choices=("eagle", "eagle3"), default="eagle")
    ap.add_argument("--ctx", type=int, nargs="+", default=[64, 1024, 3072], help="context lengths (tokens)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default=".cache/models", help="tiny-model cache directory")
    ap.add_argument("--log", default=".cache/demo-server.log")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(ns) -> int:
    from .main import CliError

    if any(c < 1 or c > 8000 for c in ns.ctx):
        raise CliError("--ctx values must be between 1 and 8000 tokens for the tiny model")
    ha = ns.draft == "eagle"
    os.environ.setdefault("CTXPROF_QUIET", "1")
    paths = build(TinyModelArgs(arch="deepseek-v3", draft=ns.draft, high_acceptance=ha,
                                out=os.path.join(ns.models, f"deepseek-v3-{ns.draft}{'-ha' if ha else ''}")))
    alg = "EAGLE3" if ns.draft == "eagle3" else "EAGLE"
    args = cpu_args(paths["target"], algorithm=alg, draft=paths["draft"]) + ["--enable-ctx-profile"]
    os.makedirs(os.path.dirname(ns.log) or ".", exist_ok=True)
    print(f"starting SGLang on CPU: tiny DeepSeek-V3 (MLA+MoE) + {alg} draft, --enable-ctx-profile "
          f"(log: {ns.log})", flush=True)
    with ServerProcess(args, log_path=ns.log) as srv:
        print(f"server ready in {srv.startup_s:.1f}s at {srv.url}", flush=True)
        _post(srv.url + "/generate", {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8}})
        _post(srv.url + "/ctx_profile/reset", {})
        for ctx in ns.ctx:
            for r in range(ns.repeat):
                rng = random.Random(ctx * 100 + r)
                ids = [rng.randint(10, 4000) for _ in range(ctx)]
                t0 = time.time()
                out = _post(srv.url + "/generate", {"input_ids": ids, "sampling_params": {
                    "max_new_tokens": ns.max_new_tokens, "temperature": 0, "ignore_eos": True}})
                mi = out["meta_info"]
                print(f"  ctx={ctx:5d} run {r + 1}: {mi['completion_tokens']} tokens in {time.time() - t0:.2f}s, "
                      f"{mi['spec_verify_ct']} steps, accept length {mi['spec_accept_length']:.2f}", flush=True)
        with urllib.request.urlopen(srv.url + "/ctx_profile?format=text", timeout=60) as r:
            print()
            print(r.read().decode(), end="")
    print("server stopped.")
    return 0
