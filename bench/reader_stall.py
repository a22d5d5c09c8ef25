#!/usr/bin/env python3
"""Do reads stall the server?  Chunk gaps of a long streamed generation with and without readers.

One real SGLang server on this CPU (tiny DeepSeek-V3 + the identity EAGLE head, ``--enable-ctx-profile``,
the flags of ``cli.server.cpu_args``) is warmed with ``--warm`` mixed requests (so the profile, the
request log and the step ring hold data, as on a server that has been serving), then streams
``--new`` tokens of one greedy generation per arm and records when each chunk arrives.  Three arms,
run one after the other on the same server, ``--rounds`` times (the order reverses every other
round so a drift cancels):

* ``none``: no reader;
* ``sglang``: one thread (``--readers`` threads) looping, back to back, on SGLang's own ``/get_server_info``,
  ``/get_model_info``, ``/health`` and ``/v1/models``;
* ``ctxprof``: one thread looping on ``/ctx_profile``, ``/ctx_profile/diagnosis``,
  ``/ctx_profile/requests?slowest=1000`` and ``/ctx_profile/trace.json?last=2048``.

Printed: per arm the chunk gap p50 / p99 / max (ms) and the CPU time of SGLang's HTTP process and
of its children (schedulers, detokenizer) over the stream's wall time (``http cpu``, ``sched cpu``:
1.0 is one core; less noisy than the gaps on a shared machine; only for a server this script
started), the ratio of the ctxprof arm's p99 to the
sglang arm's (the goal is at most 1.2), over all rounds and per round (the two arms of a round ran
back to back) with the median of the rounds' ratios (one p99 of a few hundred gaps moves by about
±0.2 from run to run on a shared machine), and per read route its count, latency p50 / p99 and body
size.  Last, ``/ctx_profile`` latency on the idle server (``--idle-reads`` reads: the first after
the last change builds, the rest may be served from a cache) with the server's decode-step count.

``--gc-probe`` (a server this script starts) puts ``bench/gcprobe`` first on the server's
``PYTHONPATH``: its ``sitecustomize`` times every generation-1 and -2 garbage collection in each
SGLang process (HTTP, scheduler, detokenizer).  Printed then per arm and process: the full
(generation-2) collections during the stream, their total and longest pause, and for the arm's
longest chunk gaps whether a full collection overlapped them.  Counts of full collections are
robust to a busy machine where gap sizes are not.  ``--gc-census`` adds, per process, what each
full collection found kept and promoted since the previous one, by kind (``census-<pid>.txt`` in
the probe's folder; slow, for a diagnosis).

The server's code is whatever ``sglang_ctxprof`` the environment imports (``PYTHONPATH`` wins over
this checkout), so the same script measures another revision.  ``--url`` measures a running server.
A benchmark, not a test: it asserts nothing about timing.  ``--out FILE`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import statistics
import sys
import threading
import time
import urllib.request
from http.client import HTTPConnection
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (another revision) wins
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gcprobe_report as gcprobe  # noqa: E402  (bench/, beside this script)
from bench_server import start_server  # noqa: E402

SGLANG_READS = ("/get_server_info", "/get_model_info", "/health", "/v1/models")
CTXPROF_READS = ("/ctx_profile", "/ctx_profile/diagnosis", "/ctx_profile/requests?slowest=1000",
                 "/ctx_profile/trace.json?last=2048")
ARMS = {"none": (), "sglang": SGLANG_READS, "ctxprof": CTXPROF_READS}


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(10, 3999) for _ in range(n)]


def _get(url: str) -> tuple[int, int, float]:
    """(status, bytes, ms) of one GET."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=300) as r:
            body, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return status, len(body), (time.perf_counter() - t0) * 1e3


def _generate(url: str, n: int, new: int, seed: int) -> None:
    body = json.dumps({"input_ids": _ids(n, seed),
                       "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def stream(url: str, prompt: int, new: int, seed: int) -> list[float]:
    """Arrival times (s, monotonic) of the ``data:`` chunks of one streamed greedy generation."""
    host, port = url.split("//")[1].split(":")
    c = HTTPConnection(host, int(port), timeout=600)
    c.request("POST", "/generate", json.dumps({
        "input_ids": _ids(prompt, seed), "stream": True,
        "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}),
        {"Content-Type": "application/json"})
    resp = c.getresponse()
    times = []
    while True:
        line = resp.fp.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data:"):
            times.append(time.monotonic())
    c.close()
    return times


class Reader(threading.Thread):
    """Loops over ``paths`` back to back until stopped; keeps (status, bytes, ms) per path."""

    def __init__(self, url: str, paths: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.url, self.paths = url, paths
        self.stop_ev = threading.Event()
        self.seen: dict[str, list[tuple[int, int, float]]] = {p: [] for p in paths}

    def run(self) -> None:
        while not self.stop_ev.is_set():
            for p in self.paths:
                if self.stop_ev.is_set():
                    break
                self.seen[p].append(_get(self.url + p))


def pct(v: list[float], q: float) -> float:
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def cpu_s(pid: Optional[int]) -> tuple[float, float]:
    """(CPU seconds of process ``pid``: SGLang's HTTP process, of its child processes: the
    schedulers and the detokenizer), from psutil; (nan, nan) when unknown."""
    if pid is None:
        return float("nan"), float("nan")
    import psutil

    p = psutil.Process(pid)
    t = p.cpu_times()
    kids = 0.0
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            kids += ct.user + ct.system
        except psutil.Error:
            pass
    return t.user + t.system, kids


def run_arm(url: str, arm: str, ns, seed: int, pid: Optional[int] = None) -> dict:
    readers = [Reader(url, ARMS[arm]) for _ in range(ns.readers)] if ARMS[arm] else []
    for r in readers:
        r.start()
    if readers:
        time.sleep(0.5)  # the loop is running before the first chunk
    (h0, k0), w0 = cpu_s(pid), time.monotonic()
    times = stream(url, ns.prompt, ns.new, seed)
    w1 = time.monotonic()
    (h1, k1), wall = cpu_s(pid), w1 - w0
    for r in readers:
        r.stop_ev.set()
    for r in readers:
        r.join()
    gaps = [(b - a) * 1e3 for a, b in zip(times, times[1:])][ns.skip:]
    reads: dict[str, list] = {}
    for r in readers:
        for p, v in r.seen.items():
            reads.setdefault(p, []).extend(v)
    return {"arm": arm, "chunks": len(times), "gaps_ms": gaps, "reads": reads,
            "http_cpu_s": h1 - h0, "sched_cpu_s": k1 - k0, "wall_s": wall, "t0": w0, "t1": w1, "times": times}


def summarize(results: list[dict]) -> dict:
    arms: dict[str, dict] = {}
    for arm in ARMS:
        gaps = [g for r in results if r["arm"] == arm for g in r["gaps_ms"]]
        reads: dict[str, list] = {}
        for r in results:
            if r["arm"] == arm:
                for p, v in r["reads"].items():
                    reads.setdefault(p, []).extend(v)
        wall = sum(r["wall_s"] for r in results if r["arm"] == arm)
        arms[arm] = {"chunks": sum(r["chunks"] for r in results if r["arm"] == arm), "gap_p50_ms": pct(gaps, 50),
                     "http_cpu_share": sum(r["http_cpu_s"] for r in results if r["arm"] == arm) / wall,
                     "sched_cpu_share": sum(r["sched_cpu_s"] for r in results if r["arm"] == arm) / wall,
                     "gap_p99_ms": pct(gaps, 99), "gap_max_ms": max(gaps) if gaps else float("nan"),
                     "reads": {p: {"n": len(v), "bad": sum(1 for s, _, _ in v if s != 200),
                                   "ms_p50": pct([m for _, _, m in v], 50), "ms_p99": pct([m for _, _, m in v], 99),
                                   "bytes_p50": pct([b for _, b, _ in v], 50)} for p, v in reads.items()}}
    per_round = []  # the two reader arms of one round ran back to back: a drift of the machine cancels
    for k in sorted({r["round"] for r in results if "round" in r}):
        p99 = {r["arm"]: pct(r["gaps_ms"], 99) for r in results if r.get("round") == k}
        if p99.get("ctxprof") and p99.get("sglang"):
            per_round.append(p99["ctxprof"] / p99["sglang"])
    return {"arms": arms, "ratio_p99_ctxprof_over_sglang": arms["ctxprof"]["gap_p99_ms"] / arms["sglang"]["gap_p99_ms"],
            "ratio_p99_per_round": per_round,
            "ratio_p99_median_of_rounds": statistics.median(per_round) if per_round else float("nan")}


def report(summary: dict, idle: Optional[dict]) -> None:
    print(f"{'readers':<10}{'chunks':>8}{'gap p50 ms':>12}{'gap p99 ms':>12}{'gap max ms':>12}"
          f"{'http cpu':>10}{'sched cpu':>11}")
    for arm, a in summary["arms"].items():
        print(f"{arm:<10}{a['chunks']:>8}{a['gap_p50_ms']:>12.1f}{a['gap_p99_ms']:>12.1f}{a['gap_max_ms']:>12.1f}"
              f"{a['http_cpu_share']:>10.2f}{a['sched_cpu_share']:>11.2f}")
    print(f"p99 chunk gap, ctxprof readers / sglang readers: {summary['ratio_p99_ctxprof_over_sglang']:.2f} "
          "(goal <= 1.2)")
    if summary.get("ratio_p99_per_round"):
        print("  per round: " + ", ".join(f"{x:.2f}" for x in summary["ratio_p99_per_round"])
              + f"; median {summary['ratio_p99_median_of_rounds']:.2f}")
    for arm in ("sglang", "ctxprof"):
        for p, r in summary["arms"][arm]["reads"].items():
            print(f"  {p:<40} n={r['n']:<4} bad={r['bad']:<3} p50 {r['ms_p50']:7.1f} ms  p99 {r['ms_p99']:7.1f} ms  "
                  f"{r['bytes_p50'] / 1e3:8.1f} kB")
    if idle:
        print(f"/ctx_profile on the idle server after {idle['decode_steps']} decode steps "
              f"({idle['records']} records): first {idle['first_ms']:.1f} ms, then p50 {idle['rest_p50_ms']:.1f} ms")


def idle_reads(url: str, n: int) -> dict:
    first = _get(url + "/ctx_profile")[2]
    rest = [_get(url + "/ctx_profile")[2] for _ in range(n - 1)]
    with urllib.request.urlopen(url + "/ctx_profile", timeout=300) as r:
        tot = json.loads(r.read())["totals"]
    return {"first_ms": first, "rest_p50_ms": pct(rest, 50), "decode_steps": tot["decode_steps"], "records": tot["records"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="measure this running server instead of starting one")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens of the streamed request")
    ap.add_argument("--new", type=int, default=1500, help="tokens the streamed request generates")
    ap.add_argument("--warm", type=int, default=24, help="warm-up requests before the arms (96 new tokens each)")
    ap.add_argument("--readers", type=int, default=1,
                    help="threads looping on the arm's routes at once (several: a client hammering the server)")
    ap.add_argument("--rounds", type=int, default=1, help="each arm this many times (order reversed every other round)")
    ap.add_argument("--skip", type=int, default=5, help="first chunk gaps of each stream left out (prefill, start)")
    ap.add_argument("--idle-reads", type=int, default=5)
    ap.add_argument("--log", default=str(ROOT / ".cache" / "bench-logs" / "reader_stall.log"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--gc-probe", action="store_true",
                    help="time the garbage collections of the server's processes (bench/gcprobe)")
    ap.add_argument("--no-freeze-gc", action="store_true",
                    help="do not send SGLang's freeze_gc once the server is up (cli.server does by default): "
                         "the freeze is then left to SGLang's own race with uvicorn")
    ap.add_argument("--gc-census", action="store_true",
                    help="with --gc-probe: also count, at each full collection once the arms start, what the "
                         "process kept and promoted, by kind (slow: a diagnosis; gcprobe/sitecustomize.py)")
    ns = ap.parse_args(argv)
    ns.gc_probe = ns.gc_probe or ns.gc_census
    import sglang_ctxprof

    print(f"server code: {Path(sglang_ctxprof.__file__).parent}", flush=True)
    srv = None
    url = ns.url
    if url is None:
        Path(ns.log).parent.mkdir(parents=True, exist_ok=True)
        env = {}
        if ns.gc_probe:
            probe_dir = gcprobe.new_dir(Path(ns.log).parent)
            env = gcprobe.server_env(probe_dir)
            print(f"gc probe: {probe_dir}", flush=True)
        srv = start_server(ns.log, env=env, freeze_gc=not ns.no_freeze_gc)
        url = srv.url
        print(f"server up in {srv.startup_s:.0f} s; SGLang's freeze_gc after start-up: "
              f"{ {True: 'answered', False: 'failed', None: 'left to SGLang'}[getattr(srv, 'gc_frozen', None)]}",
              flush=True)
    try:
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: _generate(url, 40 + 60 * i, 96, 100 + i), range(ns.warm)))
        if ns.gc_probe and ns.gc_census and srv is not None:
            (probe_dir / "census").touch()
        results = []
        order = list(ARMS)
        for k in range(ns.rounds):
            for arm in (order if k % 2 == 0 else order[::-1]):
                r = run_arm(url, arm, ns, seed=9000 + k, pid=srv.proc.pid if srv is not None else None)
                print(f"round {k} {arm}: {r['chunks']} chunks, gap p50 {pct(r['gaps_ms'], 50):.1f} ms "
                      f"p99 {pct(r['gaps_ms'], 99):.1f} ms", flush=True)
                results.append({**r, "round": k})
        summary = summarize(results)
        idle = idle_reads(url, ns.idle_reads) if ns.idle_reads > 0 else None
        roles = gcprobe.roles(srv.proc.pid) if srv is not None and ns.gc_probe else {}
    finally:
        if srv is not None:
            srv.stop()
    report(summary, idle)
    if srv is not None and ns.gc_probe:
        summary["gc"] = gcprobe.attribute(probe_dir, roles, results)
        summary["gc"]["sglang_own_freeze_failed"] = "post-warmup freeze_gc failed" in Path(ns.log).read_text(errors="replace")
        summary["gc"]["freeze_after_start"] = getattr(srv, "gc_frozen", None)
        print(f"SGLang's own post-warmup freeze_gc: {'failed' if summary['gc']['sglang_own_freeze_failed'] else 'ok'}; "
              f"ours after start-up: {summary['gc']['freeze_after_start']}")
        gcprobe.report(summary["gc"])
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump({"summary": summary, "idle": idle, "args": vars(ns)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
