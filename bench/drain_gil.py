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

Per batch size (default 1, 32 and 256), windows of ``--window`` steps rotate between three modes:

* **idle**: the drain thread held (``Recorder.stop``); what the window queued is drained after it,
  untimed;
* **whole**: the drain thread running, each wake-up draining the whole queue under one GIL hold
  (what ``Recorder.flush`` does; the drain thread did so before ``collect/pacing.py``);
* **paced**: the drain thread as it runs now (``pacing.Pacer``'s defaults);
* **process**: the drain in a process of its own (a spawned child running a profiler's recorder,
  aggregator and default sinks), fed by a forwarding thread in the scheduler's process that turns
  the queued host facts into plain facts (``HostFacts.facts``) in paced slices and writes them,
  pickled, to a pipe (``Forwarder``).  The child builds each record (``StepFacts.record``) and
  aggregates it on its own GIL; its CPU still competes for the machine's cores.  "drain µs/record"
  is then the forwarder's CPU in the scheduler's process;
* **inline**: the same drain process, fed by the scheduler thread itself: after each step it turns
  what the step queued into plain facts and writes them, pickled, to the pipe (no thread to wake;
  the hand-off is on the step's own time, and counted in the step's wall time).

The step is all CPU by default (a CPU server's).  ``--device cuda`` makes it a GPU-bound step:
the ops launched on the GPU, then ``torch.cuda.synchronize()`` (the scheduler thread parked, the GIL
released, while the device computes).  ``--wait-ms`` models that shape without a GPU: the ops (the
host's launch work) on the CPU, then a GIL-free sleep.  The fake scheduler
also leaves ``--engine-objects`` tracked objects per step, so that young collections come at
SGLang's own pace (``Sched``).

The scheduler thread stamps the start of every step; printed per mode are the step-to-step time
p50 and p99 (ms), each busy mode's ratios to idle side by side, and the added delay (busy - idle) at p50 and
p99 as % of the idle p50 step (the goal: p99 ≤ 1%).  The wall time carries the machine's other load
(run-queue waits); so, per step, the scheduler thread's GIL wait is also printed: the wall time
less its time on a CPU (``time.thread_time_ns``, exact: the kernel's ``schedstat`` run time moves
only at scheduler ticks, 4 ms here, too coarse for a step) and in the run queue
(``/proc/thread-self/schedstat``'s wait, updated whenever the thread is switched in; the loop never
sleeps but in ``--wait-ms``, which is taken out as well: its oversleep is the same busy and idle),
at p50 and p99 for each mode, and busy - idle as % of the idle p50 step; and the scheduler
thread's own CPU time per step, idle and busy at p50, busy - idle as % of the idle p50 step ("CPU
%": the hand-off of the inline mode, and whatever slows the thread's own work down while another
core runs the drain, e.g. vCPUs that share a physical core).  So the wall delay splits into CPU,
GIL wait and run-queue wait.  Then the drain
thread's own CPU µs per record
(``Cost``), the longest garbage-collector pause on each thread (the start-up heap, torch's
included, is frozen first, as SGLang's scheduler freezes its own on ``POST /freeze_gc``;
``--no-freeze`` leaves it to the collector, whose full collections then walk it: 0.2-0.3 s), and "catch-up": the most steps a busy
window ran past its planned ones until its records were drained (they are timed with it, so work a
slow drain defers counts against it).
``--json FILE`` writes the rows.

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
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sglang_ctxprof.testing.fake_scheduler import FakeScheduler  # noqa: E402
from sglang_ctxprof.testing.fake_worker import HOOKS, AcceptLens, FakeReq, FakeWorker  # noqa: E402

CTX = 2048


class _Forward:
    """``ops`` torch matmuls (each releases the GIL) with a little Python around each, as modules have;
    on ``device`` "cuda" they are launched and the step ends in ``torch.cuda.synchronize()`` (the GIL
    released while the GPU computes: a GPU-bound step, for real); then, with ``wait_s``, a sleep (the
    GIL released, no CPU used): the same shape modelled where there is no GPU."""

    ops = 100
    size = 64
    wait_s = 0.0
    device = "cpu"

    def __init__(self) -> None:
        self.a = torch.randn(self.size, self.size, device=self.device)
        self.b = torch.randn(self.size, self.size, device=self.device)

    def run(self) -> None:
        a, b, mm = self.a, self.b, torch.mm
        for i in range(self.ops):
            c = mm(a, b)
            if i & 7 == 0:
                c = c[:1]  # a view: a little more Python, as a module's reshapes are
        if self.device != "cpu":
            torch.cuda.synchronize()
        if self.wait_s:
            time.sleep(self.wait_s)


def engine_garbage(k: int) -> None:
    """``k`` small tracked objects in one reference cycle: garbage only a collection frees."""
    if k <= 0:
        return
    head = node = {}
    for _ in range(k - 1):
        node["next"] = node = {}
    node["next"] = head


class Sched(FakeScheduler):
    """The fake scheduler, whose requests finish after their ``life`` (SGLang's books set) and which
    leaves ``engine_objects`` tracked objects per step for the collector, as SGLang's scheduler
    does: young collections come every ~8-10 decode steps on the real server with profiling off, at
    batch 1, 8 and 32 (``bench/gc_cadence.py``), whatever the profiler adds.  Without them the
    profiler's own objects alone would set the collector's pace."""

    engine_objects = 0

    def process_batch_result(self, batch, result):
        engine_garbage(self.engine_objects)
        out = super().process_batch_result(batch, result)
        for req, a in zip(batch.reqs, batch.result.accept):
            req.spec_num_correct_drafts += a - 1
            if req.spec_verify_ct >= req.life and req.finished_reason is None:
                req.finished_reason = "length"
                req.finished_len = len(req.output_ids)
        return out


_MODE = SimpleNamespace(is_decode=lambda: True)


class Batch:
    """A running batch of ``n`` requests; finished ones are replaced before the next step."""

    def __init__(self, n: int, life: int) -> None:
        self.n, self.life, self.made = n, life, 0
        self.prompt = [0] * (CTX - 1)
        accept = [1 + (i % 3) for i in range(n)]
        self.result = SimpleNamespace(accept_lens=AcceptLens(accept), accept=accept, speculative_num_draft_tokens=4)
        # staggered ages, so about n / life requests finish at each step
        self.reqs = [self._new(life=1 + (i * life) // n) for i in range(n)]
        self.forward_mode, self.forward_iter = _MODE, 0

    def _new(self, life: int) -> FakeReq:
        self.made += 1
        return FakeReq(f"r{self.made}", self.prompt, life)

    def refill(self) -> None:
        reqs = self.reqs
        if any(r.finished_reason is not None for r in reqs):
            self.reqs = [self._new(self.life) if r.finished_reason is not None else r for r in reqs]


def session():
    from sglang_ctxprof.collect.adapter import Target
    from sglang_ctxprof.collect.session import CtxProfSession
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import exporters

    M = __name__
    return CtxProfSession(CtxProfConfig(), targets=[
        Target(f"{M}.Sched.run_batch", "run_batch"), Target(f"{M}.Sched.process_batch_result", "process_batch_result")]
        + [Target(path, hook) for path, hook in HOOKS], exporters=exporters.install)


class GcPauses:
    """The longest garbage-collector pause seen on each thread (ms), and the collections of any
    thread in all (``n``), by a gc callback."""

    def __init__(self) -> None:
        self.t0: dict[int, float] = {}
        self.longest: dict[str, float] = {}
        self.n = 0

    def __call__(self, phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self.t0[tid] = time.perf_counter()
            self.n += 1
        elif tid in self.t0:
            ms = (time.perf_counter() - self.t0.pop(tid)) * 1e3
            name = threading.current_thread().name
            self.longest[name] = max(self.longest.get(name, 0.0), ms)

    def take(self) -> tuple[dict[str, float], int]:
        out, n, self.longest, self.n = self.longest, self.n, {}, 0
        return out, n


def calibrate(op_us: float, device: str = "cpu") -> int:
    """The matmul size whose one op takes about ``op_us`` on this thread (on a GPU: until synchronized)."""
    sizes = range(16, 512, 8) if device == "cpu" else [int(256 * 1.25 ** k) for k in range(20)]
    for size in sizes:
        a = torch.randn(size, size, device=device)
        best = float("inf")
        for _ in range(5):  # the fastest of 5 tries: a busy machine only slows an op down
            t0 = time.perf_counter()
            for _ in range(20):
                torch.mm(a, a)
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / 20 * 1e6)
        if best >= op_us:
            return size
    return sizes[-1]


def run_window(sched: Sched, batch: Batch, steps: int, pending=None,
               after_step=None) -> tuple[list[float], list[float], list[float]]:
    """``steps`` steps on a thread of their own (the scheduler thread), then more while ``pending()``
    (more than the one record the last step just queued is waiting: a busy drain thread's backlog,
    whose work counts in the window that made it, never after it).
    Per step, in ms: the step-to-step wall time; the thread's time on a CPU (``thread_time_ns``); and
    the time it was neither on a CPU nor waiting for one (the run-queue wait from the kernel's
    ``/proc/thread-self/schedstat``): this loop never sleeps, so that
    is the time it waited for the GIL, which a busy machine's run-queue waits do not blur."""
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
    wall, cpu, gil = [], [], []
    wait_ns = int(_Forward.wait_s * 1e9)  # the forward's own GIL-free wait is not a GIL wait
    for (t0, r0, w0), (t1, r1, w1) in zip(stamps, stamps[1:]):
        wall.append((t1 - t0) / 1e6)
        cpu.append((r1 - r0) / 1e6)
        gil.append(max(0, (t1 - t0) - (r1 - r0) - (w1 - w0) - wait_ns) / 1e6)
    return wall, cpu, gil


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# The busy modes: the drain thread as it was (the whole queue in one go under one GIL hold, as
# ``Recorder.flush`` does), as it is (``pacing.Pacer``'s defaults), and a drain in a process of its
# own fed by a forwarding thread (``Forwarder``).
MODES = ("idle", "whole", "paced", "process", "inline")


def _drain_child(conn) -> None:
    """The drain process: a profiler's recorder, aggregator and default sinks (as the session's), fed
    the records built from the step facts it receives; ``None`` asks it to drain all and answer."""
    from sglang_ctxprof.collect.profiler import Profiler
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import exporters

    p = Profiler(CtxProfConfig())
    p.attach_exporters(exporters.install(p.config))
    p.guard.run("exporter", p.exporters.bind, p.bind_facts(None))
    p.recorder.start()
    recv, submit = conn.recv_bytes, p.recorder.submit
    while True:
        items = pickle.loads(recv())
        if items is None:
            p.recorder.flush()
            conn.send_bytes(pickle.dumps((p.recorder.submitted, p.aggregator.records)))
        elif items == "stop":
            p.recorder.close()
            return
        else:
            for f in items:
                r = f.record()
                if r is not None:
                    submit(r)


class Forwarder:
    """The scheduler process's side of a drain process: a thread that takes the recorder's queued
    items in slices of ``pacing.SLICE_NS`` (as the paced drain thread's), turns host facts into
    plain facts (``HostFacts.facts``: the request ids, the CPU-clock arithmetic, the finished
    requests' books), pickles each slice and writes it to the child's pipe (the write releases the
    GIL), then pauses ``pacing.PAUSE_S`` so a waiting scheduler thread takes the GIL.  Its own CPU
    time per record is what the scheduler's process still pays."""

    def __init__(self, q, conn, thread: bool = True) -> None:
        self.q, self.conn = q, conn
        self.ns = self.records = 0
        self.stop_ev = threading.Event()
        self.thread = None
        if thread:
            self.thread = threading.Thread(target=self._loop, name="ctxprof-recorder", daemon=True)
            self.thread.start()

    def after_step(self) -> None:
        """No thread ('inline'): the scheduler thread hands the step over itself, after the step."""
        t0 = time.thread_time_ns()
        self._slice(until_empty=True)
        self.ns += time.thread_time_ns() - t0

    def _slice(self, until_empty: bool = False) -> None:
        from sglang_ctxprof.collect.host import HostFacts
        from sglang_ctxprof.collect.pacing import SLICE_NS

        q, pc, out = self.q, time.perf_counter_ns, []
        t0 = pc()
        while q and (until_empty or pc() - t0 < SLICE_NS):
            item = q.popleft()
            out.append(item.facts() if type(item) is HostFacts else item)
        if out:
            self.conn.send_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            self.records += len(out)

    def _loop(self) -> None:
        from sglang_ctxprof.collect.pacing import PAUSE_S
        from sglang_ctxprof.collect.recorder import POLL_S

        tt = time.thread_time_ns
        while not self.stop_ev.is_set():
            if self.q:
                t0 = tt()
                self._slice()
                self.ns += tt() - t0
                time.sleep(PAUSE_S)
            else:
                self.stop_ev.wait(POLL_S)

    def close(self) -> tuple[int, int]:
        """Stop the thread, forward what is left, wait until the child has drained it all; returns
        this side's CPU ns and records."""
        self.stop_ev.set()
        if self.thread is not None:
            self.thread.join()
        self._slice(until_empty=True)
        self.conn.send_bytes(pickle.dumps(None))
        self.conn.recv_bytes()
        return self.ns, self.records


def pacer_for(mode: str):
    from sglang_ctxprof.collect.pacing import Pacer

    return Pacer(slice_ns=2**62, pause_s=0.0) if mode == "whole" else Pacer()


def measure(n: int, a: argparse.Namespace, gcp: GcPauses, conn) -> list[dict]:
    fwd = _Forward()
    sess = session()
    sess.instrument()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    gil: dict[str, list[float]] = {m: [] for m in MODES}
    backlog: dict[str, int] = dict.fromkeys(MODES, 0)
    gc_ms: dict[str, dict[str, float]] = {m: {} for m in MODES}
    gc_n: dict[str, int] = dict.fromkeys(MODES, 0)
    drain: dict[str, list[int]] = {m: [0, 0] for m in MODES}
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
                    rec.pacer = pacer_for(mode)
                    rec.start()
                gcp.take()
                ns0, n0 = cost.drain_ns, cost.drain_records
                w, c, g = run_window(sched, batch, a.window, None if mode == "idle" else (lambda: len(rec._q) > 1),
                                     fw.after_step if fw is not None and fw.thread is None else None)
                backlog[mode] = max(backlog[mode], len(w) - a.window)
                times[mode] += w
                cpu[mode] += c
                gil[mode] += g
                longest, n_gc = gcp.take()
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
    rows = []
    for m in MODES[1:]:
        b50, b99 = statistics.median(times[m]), pct(times[m], 0.99)
        rows.append({"batch": n, "mode": m, "idle_p50_ms": i50, "idle_p99_ms": i99, "busy_p50_ms": b50,
                     "busy_p99_ms": b99, "p50_ratio": b50 / i50, "p99_ratio": b99 / i99,
                     "p50_delay_pct": (b50 - i50) / i50 * 100, "p99_delay_pct": (b99 - i99) / i50 * 100,
                     "step_cpu_ms": step_cpu, "busy_cpu_ms": statistics.median(cpu[m]),
                     "cpu_p50_pct": (statistics.median(cpu[m]) - step_cpu) / i50 * 100,
                     "gil_wait_idle_ms": g["idle"], "gil_wait_busy_ms": g[m],
                     "gil_p50_pct": (g[m][0] - g["idle"][0]) / i50 * 100,
                     "gil_p99_pct": (g[m][1] - g["idle"][1]) / i50 * 100,
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
          f"{'p99':>6} | {'GIL % p50':>9} {'p99':>6} || {'drain us/rec':>12} | {'gc max ms sched/drain':>21} | "
          f"{'gc /100 steps idle/busy':>23} | catch-up",
          flush=True)
    rows = []
    conn, child_end = mp.Pipe()
    child = mp.get_context("spawn").Process(target=_drain_child, args=(child_end,), daemon=True)
    child.start()
    for n in a.batches:
        for r in measure(n, a, gcp, conn):
            rows.append(r)
            gc_, gi, gb = r["gc_ms"], r["gil_wait_idle_ms"], r["gil_wait_busy_ms"]
            print(f"{n:>5} {r['mode']:>5} | {r['idle_p50_ms']:8.2f} {r['idle_p99_ms']:7.2f} | {r['busy_p50_ms']:8.2f} "
                  f"{r['busy_p99_ms']:7.2f} | {r['p50_ratio']:9.3f} {r['p99_ratio']:6.3f} | {r['p50_delay_pct']:11.2f} "
                  f"{r['p99_delay_pct']:6.2f} || {r['step_cpu_ms']:8.2f} {r['busy_cpu_ms']:6.2f} {r['cpu_p50_pct']:9.2f} | {gi[0]:17.3f} {gi[1]:6.3f} | {gb[0]:8.3f} "
                  f"{gb[1]:6.3f} | {r['gil_p50_pct']:9.2f} {r['gil_p99_pct']:6.2f} || {r['drain_us_per_record']:12.0f} | "
                  f"{gc_.get('scheduler', 0.0):10.1f} / {gc_.get('ctxprof-recorder', 0.0):8.1f} | "
                  f"{r['gc_per_100_steps'][0]:11.1f} / {r['gc_per_100_steps'][1]:9.1f} | {r['busy_backlog']:>7}",
                  flush=True)
    conn.send_bytes(pickle.dumps("stop"))
    child.join(30)
    print("goal: p99 delay <= 1% of the step (GIL % p99: the same, with the machine's other load taken out)")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
