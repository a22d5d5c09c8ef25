#!/usr/bin/env python3
"""How much the recorder's drain thread delays the scheduler thread through the GIL.

A scheduler thread runs a loop shaped like SGLang's speculative decode (``run_batch`` -> the
worker's draft + verify -> ``process_batch_result``, hooked by the real profiler session with its
default exporters), where the forward is ``--ops`` torch matmuls that each release the GIL (as every
torch op does; one thread, ~``--op-us`` each) with a little Python between them, as a model's
modules have.  Each request runs ``--life`` steps, then finishes (with the engine's books) and is
replaced by a new one, so the request history stays at its steady-state size and the batch's
membership changes as it does on a busy server.  Every step's host facts go to the real
:class:`~sglang_ctxprof.collect.recorder.Recorder`, whose drain thread builds the record and feeds
the aggregator (with its audit), the logs, metrics and OTel sinks: the per-record cost is the
real one.

Per batch size (default 1, 32 and 256), windows of ``--window`` steps rotate between the modes:
**idle** (the drain thread held by ``Recorder.stop``; what the window queued is drained after it,
untimed); **whole** (each wake-up drains the whole queue under one GIL hold, as ``Recorder.flush``
does); **paced** (the drain thread as it runs now: ``pacing.for_device`` of the modelled device,
an accelerator's with ``--device cuda`` or ``--wait-ms``, else the CPU's); **process** and
**inline** (the drain in a process of its own, fed by a forwarding thread or by the scheduler
thread after each step: ``bench/drain_child.py``; "drain µs/record" is then the hand-off's CPU).

The step is all CPU by default (a CPU server's).  ``--device cuda`` makes it GPU-bound: the ops
launched on the GPU, then ``torch.cuda.synchronize()`` (the GIL released while the device
computes).  ``--wait-ms`` models that shape without a GPU: the ops on the CPU, then a GIL-free
sleep.  The fake scheduler leaves ``--engine-objects`` tracked objects per step, so young
collections come at SGLang's own pace (``Sched``).

Printed per mode: the step-to-step time p50 and p99 (ms), each busy mode's ratios to idle, and the
added delay (busy - idle) at p50 and p99 as % of the idle p50 step (the goal: p99 ≤ 1%).  The wall
time carries the machine's other load, so the scheduler thread's GIL wait per step is also
printed: the wall time less its time on a CPU (``time.thread_time_ns``) and in the run queue
(``/proc/thread-self/schedstat``'s wait; ``--wait-ms`` is taken out as well), busy - idle as % of
the idle p50 step; and "floor": the same p99 difference between the idle windows of even and odd
rounds, i.e. what this machine's noise alone gives (a busy figure within it is not resolved).  "CPU
%": the scheduler thread's own CPU per step, busy - idle (the inline hand-off, or whatever slows
its own work while another core runs the drain, e.g. vCPUs sharing a physical core).  Then the
drain's CPU µs per record (``Cost``), the longest collector pause on each thread (the start-up heap
is frozen first, as SGLang's scheduler does on ``POST /freeze_gc``; ``--no-freeze`` leaves it to
the collector), young collections per 100 steps, and "catch-up": the most steps a busy window ran
past its planned ones until its records were drained.  Last, what the collector has to do with the
tail: of the busy steps at or above the p99 GIL wait, how many had a collection on the drain thread
run during them (which holds the GIL throughout), and the p99 GIL wait (busy - idle, % of the step)
over the steps that had none.  ``--json FILE`` writes the rows.

A benchmark, not a test: it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from drain_child import Forwarder, drain_child  # noqa: E402
from drain_loop import Batch, Sched, _Forward, calibrate, session  # noqa: E402
from sglang_ctxprof.collect.recorder import THREAD_NAME as DRAIN_THREAD  # noqa: E402
from sglang_ctxprof.testing.fake_worker import FakeWorker  # noqa: E402

class GcPauses:
    """The longest garbage-collector pause seen on each thread (ms), the collections of any thread
    in all (``n``), and when each collection on the drain thread ran (``perf_counter_ns`` spans), by
    a gc callback."""

    def __init__(self) -> None:
        self.t0: dict[int, int] = {}
        self.longest: dict[str, float] = {}
        self.drain_spans: list[tuple[int, int]] = []
        self.n = 0

    def __call__(self, phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self.t0[tid] = time.perf_counter_ns()
            self.n += 1
        elif tid in self.t0:
            t0, t1 = self.t0.pop(tid), time.perf_counter_ns()
            name = threading.current_thread().name
            self.longest[name] = max(self.longest.get(name, 0.0), (t1 - t0) / 1e6)
            if name == DRAIN_THREAD:
                self.drain_spans.append((t0, t1))

    def take(self) -> tuple[dict[str, float], int, list[tuple[int, int]]]:
        out, n, spans = self.longest, self.n, self.drain_spans
        self.longest, self.n, self.drain_spans = {}, 0, []
        return out, n, spans


def in_collection(steps: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """For each step (start, end), whether a drain-thread collection overlapped it."""
    return [any(s < t1 and e > t0 for s, e in spans) for t0, t1 in steps]


def run_window(sched: Sched, batch: Batch, steps: int, pending=None,
               after_step=None) -> tuple[list[float], list[float], list[float], list[tuple[int, int]]]:
    """``steps`` steps on a thread of their own (the scheduler thread), then more while ``pending()``
    (more than the one record the last step just queued is waiting: a busy drain thread's backlog,
    whose work counts in the window that made it, never after it).
    Per step, in ms: the step-to-step wall time; the thread's time on a CPU (``thread_time_ns``); and
    the time it was neither on a CPU nor waiting for one (the run-queue wait from the kernel's
    ``/proc/thread-self/schedstat``): this loop never sleeps, so that
    is the time it waited for the GIL, which a busy machine's run-queue waits do not blur; and each
    step's (start, end) on ``perf_counter_ns``."""
    stamps: list[tuple[int, int, int]] = []

    def loop() -> None:
        pc, tt = time.perf_counter_ns, time.thread_time_ns
        fd, pread = os.open("/proc/thread-self/schedstat", os.O_RDONLY), os.pread
        try:
            i = 0
            while i <= steps or (pending is not None and pending() and i <= 20 * steps):
                i += 1
                wait = pread(fd, 128, 0).split()[1]
                stamps.append((pc(), tt(), int(wait)))
                batch.refill()
                sched.process_batch_result(batch, sched.run_batch(batch))
                if after_step is not None:
                    after_step()
        finally:
            os.close(fd)

    t = threading.Thread(target=loop, name="scheduler")
    t.start()
    t.join()
    wall, cpu, gil, spans = [], [], [], []
    wait_ns = int(_Forward.wait_s * 1e9)  # the forward's own GIL-free wait is not a GIL wait
    for (t0, r0, w0), (t1, r1, w1) in zip(stamps, stamps[1:]):
        wall.append((t1 - t0) / 1e6)
        cpu.append((r1 - r0) / 1e6)
        gil.append(max(0, (t1 - t0) - (r1 - r0) - (w1 - w0) - wait_ns) / 1e6)
        spans.append((t0, t1))
    return wall, cpu, gil, spans


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


MODES = ("idle", "whole", "paced", "process", "inline")


def drain_for(mode: str, device: str):
    """A mode's pacer and looks: ``paced`` the package's for the modelled ``device``
    (``pacing.for_device``); ``whole`` the whole queue per GIL hold at an accelerator's looks."""
    from sglang_ctxprof.collect.pacing import Looks, Pacer, for_device

    return (Pacer(slice_ns=2**62, pause_s=0.0), Looks()) if mode == "whole" else for_device(device)


def measure(n: int, a: argparse.Namespace, gcp: GcPauses, conn) -> list[dict]:
    fwd = _Forward()
    sess = session()
    sess.instrument()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    gil: dict[str, list[float]] = {m: [] for m in MODES}
    hit: dict[str, list[bool]] = {m: [] for m in MODES}  # a drain-thread collection ran during the step
    backlog: dict[str, int] = dict.fromkeys(MODES, 0)
    gc_ms: dict[str, dict[str, float]] = {m: {} for m in MODES}
    gc_n: dict[str, int] = dict.fromkeys(MODES, 0)
    drain: dict[str, list[int]] = {m: [0, 0] for m in MODES}
    idle_rounds: list[list[float]] = []  # each round's idle GIL waits (the noise floor)
    try:
        sched, batch = Sched(FakeWorker(fwd.run)), Batch(n, a.life)
        rec = sess.profiler.recorder
        run_window(sched, batch, a.window)  # warm-up: binds the profiler, starts the drain thread
        rec.flush()
        if not a.no_freeze:  # what the warm-up imported and built, too (SGLang's freeze_gc comes after its warm-up)
            gc.collect()
            gc.freeze()
        cost = rec.cost
        for r in range(a.rounds):
            k = r % len(MODES)
            order = MODES[k:] + MODES[:k]  # each mode at each place in turn
            for mode in (order if r % 2 == 0 else order[::-1]):
                rec.stop()
                fw = None
                if mode in ("process", "inline"):
                    fw = Forwarder(rec._q, conn, thread=mode == "process")
                elif mode != "idle":
                    rec.pacer, rec.looks = drain_for(mode, "cuda" if a.device == "cuda" or a.wait_ms else "cpu")
                    rec.start()
                gcp.take()
                ns0, n0 = cost.drain_ns, cost.drain_records
                w, c, g, steps = run_window(sched, batch, a.window, None if mode == "idle" else (lambda: len(rec._q) > 1),
                                     fw.after_step if fw is not None and fw.thread is None else None)
                backlog[mode] = max(backlog[mode], len(w) - a.window)
                times[mode] += w
                cpu[mode] += c
                gil[mode] += g
                if mode == "idle":
                    idle_rounds.append(g)
                longest, n_gc, collections = gcp.take()
                hit[mode] += in_collection(steps, collections)
                gc_n[mode] += n_gc
                for k, v in longest.items():
                    gc_ms[mode][k] = max(gc_ms[mode].get(k, 0.0), v)
                rec.stop()
                if fw is not None:
                    ns, k = fw.close()
                    drain[mode][0] += ns
                    drain[mode][1] += k
                elif mode != "idle":
                    drain[mode][0] += cost.drain_ns - ns0
                    drain[mode][1] += cost.drain_records - n0
                rec.flush()
        if rec.dropped:
            raise RuntimeError(f"{rec.dropped} records dropped: the measurement would be short")
    finally:
        sess.uninstrument()
    i50, i99 = statistics.median(times["idle"]), pct(times["idle"], 0.99)
    step_cpu = statistics.median(cpu["idle"])
    g = {m: (statistics.median(gil[m]), pct(gil[m], 0.99)) for m in MODES}
    halves = [sum(idle_rounds[k::2], []) for k in (0, 1)]
    floor = abs(pct(halves[0], 0.99) - pct(halves[1], 0.99)) / i50 * 100 if all(halves) else float("nan")
    rows = []
    for m in MODES[1:]:
        b50, b99 = statistics.median(times[m]), pct(times[m], 0.99)
        top = [h for w, h in zip(gil[m], hit[m]) if w >= g[m][1] and w > 0]  # the steps at or above the p99 GIL wait
        rest = [w for w, h in zip(gil[m], hit[m]) if not h] or [0.0]
        rows.append({"batch": n, "mode": m, "idle_p50_ms": i50, "idle_p99_ms": i99, "busy_p50_ms": b50,
                     "busy_p99_ms": b99, "p50_ratio": b50 / i50, "p99_ratio": b99 / i99,
                     "p50_delay_pct": (b50 - i50) / i50 * 100, "p99_delay_pct": (b99 - i99) / i50 * 100,
                     "step_cpu_ms": step_cpu, "busy_cpu_ms": statistics.median(cpu[m]),
                     "cpu_p50_pct": (statistics.median(cpu[m]) - step_cpu) / i50 * 100,
                     "gil_wait_idle_ms": g["idle"], "gil_wait_busy_ms": g[m],
                     "gil_p50_pct": (g[m][0] - g["idle"][0]) / i50 * 100,
                     "gil_p99_pct": (g[m][1] - g["idle"][1]) / i50 * 100, "gil_p99_floor_pct": floor,
                     "p99_steps_in_drain_gc": (sum(top), len(top)),
                     "gil_p99_no_drain_gc_pct": (pct(rest, 0.99) - g["idle"][1]) / i50 * 100,
                     "drain_us_per_record": drain[m][0] / max(1, drain[m][1]) / 1e3, "busy_backlog": backlog[m],
                     "gc_ms": gc_ms[m], "steps_per_mode": len(times[m]),
                     "gc_per_100_steps": (100 * gc_n["idle"] / len(times["idle"]), 100 * gc_n[m] / len(times[m]))})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--ops", type=int, default=100, help="GIL-releasing torch ops per forward")
    ap.add_argument("--op-us", type=float, default=100.0, help="target time of one op (µs)")
    ap.add_argument("--window", type=int, default=100, help="steps per window")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of one window per mode, per batch size")
    ap.add_argument("--life", type=int, default=128, help="steps each request runs before it finishes")
    ap.add_argument("--device", default="cpu", help="where the forward's matmuls run: cpu, or cuda (ends each step "
                                                     "in a synchronize)")
    ap.add_argument("--wait-ms", type=float, default=0.0,
                    help="a GIL-free wait after the ops in each forward (a GPU-bound step's synchronize; 0: none, "
                         "the step all CPU)")
    ap.add_argument("--engine-objects", type=int, default=80,
                    help="tracked objects the fake scheduler leaves per step (SGLang's pace of young collections: "
                         "bench/gc_cadence.py; 0: none, the profiler's alone)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--no-freeze", action="store_true",
                    help="leave the start-up heap to the collector (SGLang's scheduler freezes its own)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    _Forward.device = a.device
    _Forward.ops, _Forward.size = a.ops, calibrate(a.op_us, a.device)
    Sched.engine_objects = a.engine_objects
    _Forward.wait_s = a.wait_ms / 1e3
    if not a.no_freeze:  # as SGLang's scheduler does on POST /freeze_gc (cli.server.ServerProcess sends it)
        gc.collect()
        gc.freeze()
    gcp = GcPauses()
    gc.callbacks.append(gcp)
    print(f"forward: {a.ops} torch matmuls of {_Forward.size}x{_Forward.size} on {a.device} (~{a.op_us:.0f} us each, GIL released); "
          f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms; windows of {a.window} steps, {a.rounds} rounds; "
          f"{a.engine_objects} engine objects per step for the collector; a GIL-free wait of {a.wait_ms:g} ms per step")
    print("step-to-step wall time (ms; a busy machine's run-queue waits included), and the scheduler thread's GIL")
    print("wait per step (ms; wall - on CPU - run-queue wait - the forward's own wait), as % of the step.  busy: the drain thread")
    print("running, 'whole' = the whole queue per GIL hold (as before), 'paced' = collect/pacing.Pacer; 'process' =")
    print("a drain process fed by a forwarding thread, 'inline' = by the scheduler thread (drain us/rec: the hand-off's)")
    print(f"{'batch':>5} {'busy':>5} | {'idle p50':>8} {'p99':>7} | {'busy p50':>8} {'p99':>7} | {'ratio p50':>9} {'p99':>6} | "
          f"{'delay % p50':>11} {'p99':>6} || {'step cpu':>8} {'busy':>6} {'CPU % p50':>9} | {'GIL wait idle p50':>17} {'p99':>6} | {'busy p50':>8} "
          f"{'p99':>6} | {'GIL % p50':>9} {'p99':>6} {'floor':>5} || {'drain us/rec':>12} | {'gc max ms sched/drain':>21} | "
          f"{'gc /100 steps idle/busy':>23} | catch-up || {'p99 in drain gc':>15} {'GIL % p99 w/o':>13}",
          flush=True)
    rows = []
    conn, child_end = mp.Pipe()
    child = mp.get_context("spawn").Process(target=drain_child, args=(child_end,), daemon=True)
    child.start()
    for n in a.batches:
        for r in measure(n, a, gcp, conn):
            rows.append(r)
            gc_, gi, gb = r["gc_ms"], r["gil_wait_idle_ms"], r["gil_wait_busy_ms"]
            print(f"{n:>5} {r['mode']:>5} | {r['idle_p50_ms']:8.2f} {r['idle_p99_ms']:7.2f} | {r['busy_p50_ms']:8.2f} "
                  f"{r['busy_p99_ms']:7.2f} | {r['p50_ratio']:9.3f} {r['p99_ratio']:6.3f} | {r['p50_delay_pct']:11.2f} "
                  f"{r['p99_delay_pct']:6.2f} || {r['step_cpu_ms']:8.2f} {r['busy_cpu_ms']:6.2f} {r['cpu_p50_pct']:9.2f} | {gi[0]:17.3f} {gi[1]:6.3f} | {gb[0]:8.3f} "
                  f"{gb[1]:6.3f} | {r['gil_p50_pct']:9.2f} {r['gil_p99_pct']:6.2f} {r['gil_p99_floor_pct']:5.2f} || {r['drain_us_per_record']:12.0f} | "
                  f"{gc_.get('scheduler', 0.0):10.1f} / {gc_.get(DRAIN_THREAD, 0.0):8.1f} | "
                  f"{r['gc_per_100_steps'][0]:11.1f} / {r['gc_per_100_steps'][1]:9.1f} | {r['busy_backlog']:>7} || "
                  f"{'%d of %d' % r['p99_steps_in_drain_gc']:>15} {r['gil_p99_no_drain_gc_pct']:13.2f}",
                  flush=True)
        if a.json:  # after each batch size: a run killed past its time keeps the rows it finished
            Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2))
    conn.send_bytes(pickle.dumps("stop"))
    child.join(30)
    print("goal: p99 delay <= 1% of the step (GIL % p99: the same, with the machine's other load taken out; floor: idle "
          "against idle, this machine's noise in that p99)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
