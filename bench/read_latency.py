#!/usr/bin/env python3
"""``/ctx_profile`` read latency on a real server after 10^4 decode steps, idle and under a light load.

One real SGLang server on this CPU (tiny DeepSeek-V3 + the identity EAGLE head, ``--enable-ctx-profile``,
the flags of ``cli.server.cpu_args``, as ``reader_stall.py`` starts it) is filled by ``--workers``
concurrent greedy requests of ``--new`` tokens, back to back, until its profile counts ``--steps``
decode steps (``totals.decode_steps`` of ``/ctx_profile``: one per decode step of the batch, however
many requests it carries).  Then, per read route (``ROUTES``: the profile as JSON, text and
Prometheus, the diagnosis as JSON and text):

* ``first``: one read right after a short request changed the data (a build);
* ``changed``: ``--changed`` reads, each after a short request changed the data (each one builds);
* ``idle``: ``--reads`` reads back to back on the unchanged idle server (the build cache serves them);
* ``loaded``: ``--reads`` reads while ``--load`` streams generate (each read sees new steps, so
  most build);
* ``loaded_b2b``: the same, back to back: ``views.http_gate`` then holds each read until the build
  thread's share allows it (a read that built for ``c`` ms waits ``9c`` ms at the default share 0.1).

Reads of the other phases are ``--gap`` seconds apart (a dashboard's poll), so the gate's
cool-down of the previous read is over when the next one arrives.

``/ctx_profile/status`` and SGLang's ``/get_server_info`` (both ask the scheduler and build nothing)
are measured alike as the floor of any read that asks the scheduler.  Printed: per route and phase the latency p50 / p99 / max (ms, client side: the whole HTTP round
trip) and the body size, with the step count when the phase ran.  The issue's goal is
``/ctx_profile`` under 50 ms after 10^4 steps.  The server's code is whatever ``sglang_ctxprof``
the environment imports (``PYTHONPATH`` wins over this checkout).  ``--url`` measures a running
server.  A benchmark, not a test: it asserts nothing about timing.  ``--out FILE`` writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (another revision) wins
sys.path.append(str(ROOT / "bench"))

from bench_server import start_server  # noqa: E402
from reader_stall import _generate, _get, pct, stream  # noqa: E402

ROUTES = ("/ctx_profile", "/ctx_profile?format=text", "/ctx_profile?format=prometheus",
          "/ctx_profile/diagnosis", "/ctx_profile/diagnosis?format=text",
          # baselines: a round trip to the scheduler with no build, ours and SGLang's own
          "/ctx_profile/status", "/get_server_info")


def totals(url: str) -> dict:
    with urllib.request.urlopen(url + "/ctx_profile", timeout=300) as r:
        return json.loads(r.read())["totals"]


def fill(url: str, target: int, workers: int, new: int, poll_s: float) -> tuple[int, float]:
    """Requests from ``workers`` threads until the profile holds ``target`` decode steps."""
    stop = threading.Event()

    def work(w: int) -> None:
        k = 0
        while not stop.is_set():
            _generate(url, 40 + (97 * (w + k)) % 360, new, 1000 * w + k)
            k += 1

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    steps = 0
    while steps < target:
        time.sleep(poll_s)
        steps = int(totals(url)["decode_steps"])
        print(f"  fill: {steps} decode steps after {time.monotonic() - t0:.0f} s", flush=True)
    stop.set()
    for t in threads:
        t.join()
    return int(totals(url)["decode_steps"]), time.monotonic() - t0


def _nudge(url: str, seed: int) -> None:
    """A short request: a few new decode steps, so the next read sees changed data."""
    _generate(url, 32, 4, seed)


def _spaced(url: str, gap: float) -> tuple[int, int, float]:
    time.sleep(gap)
    return _get(url)


def summary(v: list[tuple[int, int, float]]) -> dict:
    ms = [m for _, _, m in v]
    return {"n": len(v), "bad": sum(1 for s, _, _ in v if s != 200), "ms_p50": pct(ms, 50), "ms_p99": pct(ms, 99),
            "ms_max": max(ms) if ms else float("nan"), "bytes_p50": pct([b for _, b, _ in v], 50)}


def measure(url: str, ns) -> dict:
    out: dict = {}
    for i, route in enumerate(ROUTES):
        _nudge(url, 50_000 + i)
        time.sleep(ns.gap)
        first = [_get(url + route)]
        changed = []
        for k in range(ns.changed):
            _nudge(url, 60_000 + 100 * i + k)
            time.sleep(ns.gap)
            changed.append(_get(url + route))
        idle = [_spaced(url + route, ns.gap) for _ in range(ns.reads)]
        out[route] = {"first": summary(first), "changed": summary(changed), "idle": summary(idle)}
        print(f"  {route}: first {first[0][2]:.1f} ms, changed p50 {out[route]['changed']['ms_p50']:.1f}, "
              f"idle p50 {out[route]['idle']['ms_p50']:.1f} ms", flush=True)
    out["steps_idle"] = int(totals(url)["decode_steps"])
    stop = threading.Event()

    def load(w: int) -> None:
        k = 0
        while not stop.is_set():
            stream(url, 64, ns.load_new, 70_000 + 1000 * w + k)
            k += 1

    loaders = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(ns.load)]
    for t in loaders:
        t.start()
    time.sleep(2.0)  # the streams are decoding
    for route in ROUTES:
        out[route]["loaded"] = summary([_spaced(url + route, ns.gap) for _ in range(ns.reads)])
        out[route]["loaded_b2b"] = summary([_get(url + route) for _ in range(ns.reads)])
        print(f"  {route} loaded: p50 {out[route]['loaded']['ms_p50']:.1f} ms, back to back "
              f"{out[route]['loaded_b2b']['ms_p50']:.1f} ms", flush=True)
    stop.set()
    for t in loaders:
        t.join()
    out["steps_after"] = int(totals(url)["decode_steps"])
    return out


def report(res: dict) -> None:
    print(f"decode steps: {res['fill_steps']} after the fill ({res['fill_s']:.0f} s), {res['reads']['steps_idle']} "
          f"at the end of the idle reads, {res['reads']['steps_after']} after the loaded reads")
    print(f"{'route':<36}{'phase':<11}{'n':>4}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'kB':>8}")
    for route in ROUTES:
        for phase in ("first", "changed", "idle", "loaded", "loaded_b2b"):
            s = res["reads"][route][phase]
            print(f"{route:<36}{phase:<11}{s['n']:>4}{s['ms_p50']:>9.1f}{s['ms_p99']:>9.1f}{s['ms_max']:>9.1f}"
                  f"{s['bytes_p50'] / 1e3:>8.1f}" + (f"  bad={s['bad']}" if s["bad"] else ""))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="measure this running server instead of starting one")
    ap.add_argument("--steps", type=int, default=10_000, help="decode steps the fill reaches")
    ap.add_argument("--workers", type=int, default=2, help="concurrent requests of the fill")
    ap.add_argument("--new", type=int, default=1500, help="tokens each fill request generates")
    ap.add_argument("--poll", type=float, default=20.0, help="seconds between step counts during the fill")
    ap.add_argument("--reads", type=int, default=50, help="reads per route in the idle and loaded phases")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between reads (but loaded_b2b)")
    ap.add_argument("--changed", type=int, default=10, help="reads per route each after a short request")
    ap.add_argument("--load", type=int, default=1, help="concurrent streams of the loaded phase")
    ap.add_argument("--load-new", type=int, default=400, help="tokens each load stream generates")
    ap.add_argument("--log", default=str(ROOT / ".cache" / "bench-logs" / "read_latency.log"))
    ap.add_argument("--out", default=None)
    ns = ap.parse_args(argv)
    import sglang_ctxprof

    print(f"server code: {Path(sglang_ctxprof.__file__).parent}", flush=True)
    srv = None
    url = ns.url
    if url is None:
        srv = start_server(ns.log)
        url = srv.url
        print(f"server up in {srv.startup_s:.0f} s", flush=True)
    try:
        steps, fill_s = fill(url, ns.steps, ns.workers, ns.new, ns.poll)
        res = {"fill_steps": steps, "fill_s": fill_s, "reads": measure(url, ns), "args": vars(ns),
               "load_avg": os.getloadavg()}
    finally:
        if srv is not None:
            srv.stop()
    report(res)
    print(f"load average at the end: {res['load_avg']}")
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
