#!/usr/bin/env python3
"""Overhead budget of sglang-ctxprof: decode tok/s with profiling on vs off, and the cost per hook call.

1. **Server A/B** (real SGLang on this CPU: tiny DeepSeek-V3 + the identity EAGLE head, or
   ``--draft eagle3``): one server started with ``--enable-ctx-profile`` (and a running-request limit
   that fits the largest ``--concurrency``); profiling is toggled at run time with
   ``POST /ctx_profile/enable|disable`` (which install / remove the timing hooks) between windows.
   After a tiny warm-up, each ``--concurrency`` value (default 1 and 16, run one after the other on
   the same server) gets one discarded full-size window and then ``--pairs`` (default 12) pairs of
   one on (A) and one off (B) window, in ``--order`` ABBA (default; reverses every other pair so a
   steady drift cancels) or ABAB.  Each window sends ``--requests`` fresh short prompts (default
   max(8, 2 * concurrency)) with ``ignore_eos``, ``--concurrency`` in flight, and measures decode
   tok/s = Σ(completion_tokens - 1) / window wall time.  Per pair: the ratio on/off.  Printed per
   concurrency: each window, mean tok/s on and off, the pair-ratio range and each side's coefficient
   of variation, and a verdict line: the median pair ratio with a percentile-bootstrap 95% interval
   (10000 resamples of the pairs, fixed seed) and whether that interval lies wholly below 0.99 (the
   profiler costs more than 1%), wholly above it (less than 1%), or contains it (cannot tell at this
   precision).  ``--url`` measures an already running server instead of starting one.
2. **Micro-benchmark** of our wrappers (no server): the real hooks and Profiler on small classes;
   microseconds per hook call for a block hook inside verify (attention / MoE), a phase hook
   (draft), a pass-through call outside any step, and the fixed per-step cost (run_batch +
   step span + process_batch_result + record building), each net of the bare call.

A benchmark, not a test: it asserts nothing about timing.  ``--out FILE`` writes JSON: the micro
numbers and, per concurrency, the windows, pair ratios, median, ci95, cv_on, cv_off and the verdict.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ---- 2. micro-benchmark of our wrappers ------------------------------------------------------------
class _Attn:
    def forward(self):
        return None


class _MoE:
    def forward(self):
        return None


class _Target:
    n = 0

    def __init__(self):
        self.attn, self.moe = _Attn(), _MoE()

    def forward_batch_generation(self, batch, is_verify=False):
        a, m = self.attn.forward, self.moe.forward
        for _ in range(self.n):
            a()
            m()


class _Worker:
    def __init__(self):
        self.target = _Target()

    def forward_batch_generation(self, batch):
        self.draft(batch)
        self.target.forward_batch_generation(batch, is_verify=True)
        return None

    def draft(self, batch):
        return None


def micro(n_calls: int = 20000, n_steps: int = 2000) -> dict[str, float]:
    from types import SimpleNamespace

    from sglang_ctxprof.collect import hooks
    from sglang_ctxprof.collect.adapter import Target
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.testing.fake_scheduler import PATH, FakeScheduler

    def _exporters(config):  # the OTel/log/metric sinks the plugin installs (if present)
        try:
            from sglang_ctxprof.views import exporters
        except ImportError:
            return None
        return exporters.install(config)

    mode = SimpleNamespace(is_decode=lambda: True)

    def batch(n=1):
        reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=[0] * 64, output_ids=[1], spec_verify_ct=0,
                                finished=lambda: False) for i in range(n)]
        return SimpleNamespace(reqs=reqs, forward_mode=mode, forward_iter=0)

    def timed(fn, reps=5):
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            best = min(best, time.perf_counter_ns() - t0)
        return best / 1e3  # µs

    def workload():
        s = FakeScheduler(_Worker())
        _Target.n = n_calls

        def one_big_step():
            b = batch()
            s.process_batch_result(b, s.run_batch(b))
        big = timed(one_big_step, reps=3)
        _Target.n = 0

        def steps():
            for _ in range(n_steps):
                b = batch()
                s.process_batch_result(b, s.run_batch(b))
        small = timed(steps, reps=3)
        draft = timed(lambda: [s.model_worker.draft(None) for _ in range(n_calls)])

        def pipeline():  # 4-request steps, each record consumed at once (aggregator + sinks)
            for _ in range(n_steps):
                b = batch(4)
                s.process_batch_result(b, s.run_batch(b))
                p = hooks.profiler()
                if p is not None:
                    p.recorder.flush()
        return big, small, draft, timed(pipeline, reps=3)

    bare = workload()
    M = __name__
    session = CtxProfSession(CtxProfConfig(), targets=[Target(f"{PATH}.run_batch", "run_batch"),
                                                       Target(f"{PATH}.process_batch_result", "process_batch_result")]
                             + [Target(f"{M}.{x}", h) for x, h in (
        ("_Target.forward_batch_generation", "verify"), ("_Worker.draft", "draft"),
        ("_Attn.forward", "attn"), ("_MoE.forward", "moe"))], exporters=_exporters)
    session.instrument()
    try:
        on = workload()
    finally:
        session.uninstrument()
    return {
        "block_hook_us": (on[0] - bare[0]) / (2 * n_calls),  # attention or MoE call inside verify
        "step_fixed_us": (on[1] - bare[1]) / n_steps,  # run_batch, span, draft + verify phases, record
        "passthrough_us": (on[2] - bare[2]) / n_calls,  # a hooked call outside any step
        "pipeline_us_per_step": (on[3] - bare[3]) / n_steps,  # hooks + record + aggregator + sinks, 4 reqs
    }


# ---- 1. server A/B ---------------------------------------------------------------------------------
BAR = 0.99  # the on/off ratio the verdict tests: profiling costs at most 1% of decode tok/s


def http(method: str, url: str, body=None, timeout: float = 600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def generate(url: str, ids: list[int], new: int) -> int:
    """One greedy ``/generate`` of exactly ``new`` tokens (``ignore_eos``); returns its decode tokens."""
    st, out = http("POST", url + "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": new, "temperature": 0, "ignore_eos": True}})
    if st != 200:
        raise RuntimeError(f"/generate failed: {st} {out}")
    return out["meta_info"]["completion_tokens"] - 1


def window(url: str, n_req: int, conc: int, prompt: int, new: int, seed: int) -> float:
    """Decode tok/s of one window: ``n_req`` fresh random prompts, ``conc`` in flight at a time."""
    rng = random.Random(seed)
    prompts = [[rng.randint(10, 3999) for _ in range(prompt)] for _ in range(n_req)]

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(conc) as ex:
        toks = sum(ex.map(lambda ids: generate(url, ids, new), prompts))
    return toks / (time.perf_counter() - t0)


def median_ci(xs: list[float], n: int = 10000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``xs``: ``n`` resamples with replacement drawn by
    ``random.Random(seed)``; the (1 - level)/2 and (1 + level)/2 quantiles of the resampled medians."""
    if not xs:
        raise ValueError("median_ci needs at least one value")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    q = (1 - level) / 2
    return meds[round(q * (n - 1))], meds[round((1 - q) * (n - 1))]


def cv(xs: list[float]) -> float:
    """Coefficient of variation: sample standard deviation / mean; 0.0 for fewer than two values."""
    return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0


def verdict(conc: int, med: float, lo: float, hi: float, n: int, bar: float = BAR) -> str:
    """One line: the median on/off ratio over ``n`` pairs, its interval, and which side of ``bar`` the
    interval lies on.  Below 6 pairs the bootstrap interval is exactly the pairs' range, and says so."""
    head = f"concurrency {conc}: median on/off {med:.3f} [{lo:.3f}, {hi:.3f}] -> "
    cost = f"{1 - bar:.0%}"
    if hi < bar:
        line = head + f"interval excludes {bar} (whole interval below): the profiler costs more than {cost}"
    elif lo > bar:
        line = head + f"interval excludes {bar} (whole interval above): the profiler costs less than {cost}"
    else:
        line = head + f"interval includes {bar}: cannot tell if the cost is above or below {cost} at this precision"
    return line + (f" (only {n} pairs: the interval is just their range)" if n < 6 else "")


def profiling_on(i: int, order: str) -> bool:
    """Whether window ``i`` (0-based) is A (profiling on).  ABBA reverses every other pair."""
    return (i % 2 == 0) != (order == "ABBA" and (i // 2) % 2 == 1)


def toggle(url: str, on: bool) -> None:
    st, body = http("POST", url + ("/ctx_profile/enable" if on else "/ctx_profile/disable"))
    if st != 200:
        raise RuntimeError(f"toggle failed ({st}): {body}")


def ab_at(url: str, a: argparse.Namespace, conc: int, seed0: int) -> dict:
    """A/B windows at one concurrency: one discarded full-size window (profiling on), then ``a.pairs``
    pairs of one on and one off window.  Every window gets fresh prompts, so no radix-cache hits."""
    n_req = a.requests or max(8, 2 * conc)
    run = (lambda i: window(url, n_req, conc, a.prompt, a.max_new_tokens, seed=seed0 + i))
    print(f"concurrency {conc}: {n_req} requests per window, {a.pairs} pairs ({a.order})", flush=True)
    toggle(url, True)
    discarded = run(-1)
    print(f"  warm-up window (discarded): {discarded:8.1f} tok/s", flush=True)
    windows = []
    for i in range(2 * a.pairs):
        prof = profiling_on(i, a.order)
        toggle(url, prof)
        tps = run(i)
        windows.append({"window": i + 1, "pair": i // 2 + 1, "profiling": prof, "tok_s": tps})
        print(f"  window {i + 1:2d} {'A on ' if prof else 'B off'}: {tps:8.1f} tok/s", flush=True)
    return summarize(conc, n_req, windows, discarded)


def summarize(conc: int, n_req: int, windows: list[dict], discarded: float) -> dict:
    """Pair ratios on/off, their median with its bootstrap 95% interval, each side's CV, the verdict."""
    on = [w["tok_s"] for w in windows if w["profiling"]]
    off = [w["tok_s"] for w in windows if not w["profiling"]]
    pair = {}
    for w in windows:
        pair.setdefault(w["pair"], {})[w["profiling"]] = w["tok_s"]
    ratios = [p[True] / p[False] for _, p in sorted(pair.items())]
    med = statistics.median(ratios)
    lo, hi = median_ci(ratios)
    return {
        "concurrency": conc, "requests_per_window": n_req, "discarded_warmup_tok_s": discarded,
        "windows": windows, "tok_s_on": statistics.fmean(on), "tok_s_off": statistics.fmean(off),
        "pair_ratios": ratios, "median": med, "ci95": [lo, hi], "cv_on": cv(on), "cv_off": cv(off),
        "verdict": verdict(conc, med, lo, hi, len(ratios)),
    }


def server_ab(url: str, a: argparse.Namespace) -> dict:
    """A/B at each concurrency of ``a.concurrency`` in turn on one server, then what /ctx_profile holds."""
    window(url, 2, 2, a.prompt, 16, seed=1)  # tiny warm-up
    by_conc = {}
    for k, conc in enumerate(a.concurrency):
        by_conc[str(conc)] = s = ab_at(url, a, conc, seed0=(k + 1) * (2 * a.pairs + 10))
        print(f"  tok/s on {s['tok_s_on']:.1f}, off {s['tok_s_off']:.1f}; pair ratios "
              f"{min(s['pair_ratios']):.3f}..{max(s['pair_ratios']):.3f}; CV on {s['cv_on']:.1%}, "
              f"off {s['cv_off']:.1%}", flush=True)
    toggle(url, True)
    _, prof_body = http("GET", url + "/ctx_profile")
    _, status = http("GET", url + "/ctx_profile/status")
    body = prof_body if isinstance(prof_body, dict) else {}
    ranks = status.get("ranks") if isinstance(status, dict) else None
    return {
        "order": a.order, "pairs": a.pairs, "bar": BAR, "concurrency": by_conc,
        "profiled_steps": (body.get("totals") or {}).get("decode_steps"),
        "timing": body.get("timing"),
        "roofline": [b.get("roofline") for b in body.get("buckets") or []][:1],
        "hw": body.get("hw"),
        "split": [((r or {}).get("status") or {}).get("split") for r in ranks or []],
        "cost": [((r or {}).get("status") or {}).get("cost") for r in ranks or []],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an already running server started with --enable-ctx-profile")
    ap.add_argument("--draft", choices=("eagle", "eagle3"), default="eagle",
                    help="eagle: the identity EAGLE head (realistic acceptance); eagle3: random EAGLE-3 head")
    ap.add_argument("--pairs", type=int, default=12, help="A/B window pairs per concurrency")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per window (default: max(8, 2 * concurrency))")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16],
                    help="requests in flight; each value gets its own A/B run, one after the other")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--order", choices=("ABAB", "ABBA"), default="ABBA",
                    help="window order: A B A B ..., or A B B A ... (cancels drift and order effects)")
    ap.add_argument("--micro-only", action="store_true", help="only the wrapper micro-benchmark")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    if min(a.pairs, a.requests or 1, *a.concurrency, a.prompt, a.max_new_tokens) < 1:
        ap.error("--pairs, --requests, --concurrency, --prompt and --max-new-tokens must be >= 1")
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res: dict = {"micro": micro()}
    m = res["micro"]
    print(f"hook cost: block hook {m['block_hook_us']:.2f} us/call, phase+step fixed {m['step_fixed_us']:.2f} "
          f"us/step, pass-through {m['passthrough_us']:.2f} us/call; whole pipeline (hooks, record, aggregator, "
          f"sinks) {m['pipeline_us_per_step']:.1f} us per 4-request step", flush=True)
    if not a.micro_only:
        res["server"] = run_server(a)
        s = res["server"]
        for c in s["concurrency"].values():
            print(c["verdict"])
        print(f"profiled decode steps {s['profiled_steps']}")
        print(f"/ctx_profile: timing={s['timing']} roofline={s['roofline']} split={s['split']} hw={s['hw']}")
        print(f"self-reported cost per rank (/ctx_profile/status): {s['cost']}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


def run_server(a: argparse.Namespace) -> dict:
    """server_ab on ``a.url``, or on a tiny CPU server started here (and stopped after)."""
    if a.url is not None:
        return server_ab(a.url, a)
    from sglang_ctxprof.cli.server import ServerProcess, cpu_args
    from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build

    ha = a.draft == "eagle"
    cache = ROOT / ".cache" / "models" / f"deepseek-v3-{a.draft}{'-ha' if ha else ''}"
    mdl = build(TinyModelArgs(arch="deepseek-v3", out=str(cache), draft=a.draft, high_acceptance=ha))
    log = ROOT / ".cache" / "bench-overhead.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    alg = "EAGLE3" if a.draft == "eagle3" else "EAGLE"
    # cpu_args leaves the running-request limit to SGLang; set it so the largest concurrency fits
    extra = ["--enable-ctx-profile", "--max-running-requests", str(max(48, *a.concurrency))]
    srv = ServerProcess(cpu_args(mdl["target"], algorithm=alg, draft=mdl["draft"]) + extra,
                        log_path=str(log), timeout=900)
    print(f"starting SGLang (log {log}) ...", flush=True)
    srv.start()
    try:
        return server_ab(srv.url, a)
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
