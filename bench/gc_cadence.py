#!/usr/bin/env python3
"""How often SGLang's scheduler process collects garbage, per decode step, profiling off and on.

A collection holds the GIL for as long as it walks its generation: what the profiler adds to a
young collection is the references its young objects hold (a decode step's record columns, a
batch's worth each), and what it adds to the cadence is the tracked objects it keeps.  Whether
that shows as a rare long pause or a small cost spread over every step depends on how often
SGLang's own allocations trigger young collections anyway, which a fake scheduler cannot say.
This measures it on the real server (the tiny EAGLE model, SGLang on the CPU, ``bench_server``)
with ``bench/gcprobe`` timing every collection of the scheduler process (generation 0 included):
per concurrency, windows alternate profiling off and on (``POST /ctx_profile/disable|enable``),
each ``--requests`` greedy requests of ``--new`` tokens, and print per window the collections by
generation (count, per 100 decode steps, total and longest ms) and the decode steps (the profile's
decode steps, read from ``/ctx_profile`` before and after each on window; an off window is charged
the mean steps of the on windows, which run the same tokens).

Run it under the server lock (a real server on 2 cores).  A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))
sys.path.append(str(ROOT / "bench"))

import gcprobe_report as gcprobe  # noqa: E402
from bench_server import start_server  # noqa: E402
from overhead import http, toggle, window  # noqa: E402


def decode_steps(url: str) -> int:
    """Decode steps the profile holds (its decode buckets' exact counts, all ranks)."""
    _, body = http("GET", url + "/ctx_profile")
    return sum(b["steps"] if "steps" in b else b["counts"]["steps"] for b in body["buckets"])


def collections(rows: list[tuple[int, float, float, int]], t0: float, t1: float) -> dict[int, dict[str, float]]:
    out = {g: {"n": 0, "ms": 0.0, "max_ms": 0.0} for g in (0, 1, 2)}
    for g, a, b, _ in rows:
        if t0 <= a and b <= t1:
            ms = (b - a) * 1e3
            o = out[g]
            o["n"] += 1
            o["ms"] += ms
            o["max_ms"] = max(o["max_ms"], ms)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new", type=int, default=128, help="tokens each request generates")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="requests per window (default: 2 x concurrency)")
    ap.add_argument("--pairs", type=int, default=2, help="off/on window pairs per concurrency")
    ap.add_argument("--log", default=str(ROOT / ".cache" / "bench-logs" / "gc_cadence.log"))
    ap.add_argument("--json", help="write the windows as JSON here")
    a = ap.parse_args(argv)
    probe = gcprobe.new_dir(Path(a.log).parent)
    env = dict(gcprobe.server_env(probe), CTXPROF_GC_PROBE_MIN_GEN="0")
    srv = start_server(a.log, env=env)
    out = []
    try:
        url = srv.url
        roles = gcprobe.roles(srv.proc.pid)
        sched = [pid for pid, r in roles.items() if r == "scheduler"]
        window(url, 4, 4, a.prompt, 32, seed=99)  # warm-up
        print("conc arm  | tokens steps | gen0 n /100 steps  ms  max | gen1 n  ms  max | gen2 n  ms  max | gc ms/step")
        for conc in a.concurrency:
            n_req = a.requests or 2 * conc
            rows = []
            for i in range(2 * a.pairs):
                on = i % 2 == 1
                toggle(url, on)
                s0, t0 = decode_steps(url), time.monotonic()
                tok_s = window(url, n_req, conc, a.prompt, a.new, seed=1000 * conc + i)
                t1, s1 = time.monotonic(), decode_steps(url)
                time.sleep(0.5)  # the probe's lines of the window's last collections
                probed = gcprobe.read(probe)
                gcs = collections([row for pid in sched for row in probed.get(pid, [])], t0, t1)
                rows.append({"conc": conc, "on": on, "tokens": n_req * a.new, "tok_s": tok_s,
                             "steps": (s1 - s0) if on else None, "gc": gcs, "window_s": t1 - t0})
            on_steps = [r["steps"] for r in rows if r["on"]]
            per = sum(on_steps) / len(on_steps)
            for r in rows:
                steps = r["steps"] if r["on"] else per
                g = r["gc"]
                print(f"{conc:>4} {'on ' if r['on'] else 'off'}  | {r['tokens']:>6} {steps:>5.0f} | "
                      f"{g[0]['n']:>6} {100 * g[0]['n'] / steps:>10.1f} {g[0]['ms']:>4.0f} {g[0]['max_ms']:>4.1f} | "
                      f"{g[1]['n']:>6} {g[1]['ms']:>3.0f} {g[1]['max_ms']:>4.1f} | {g[2]['n']:>6} {g[2]['ms']:>3.0f} "
                      f"{g[2]['max_ms']:>4.1f} | {sum(v['ms'] for v in g.values()) / steps:>9.3f}", flush=True)
                r["steps_used"] = steps
            out += rows
    finally:
        srv.stop()
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "windows": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
