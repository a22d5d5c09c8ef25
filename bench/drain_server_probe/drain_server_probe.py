"""Bench-only SGLang plugin: the scheduler loop's step-to-step time with the drain thread busy or held.

Loaded by ``bench/drain_server.py`` (path-loaded through an entry point, as the test plugins are),
in every SGLang process; it acts only where ``CTXPROF_DRAIN_PROBE`` names an output folder and only
in a scheduler process.  It wraps ``Scheduler.run_batch`` (before ``--enable-ctx-profile`` wraps it
in turn) to take, at each call on the scheduler thread, the wall clock, the thread's CPU time
(``time.thread_time_ns``) and its run-queue wait (``/proc/thread-self/schedstat``), with the batch's
size, whether it is a decode step, and the window it ran in.

A window thread alternates windows of ``CTXPROF_DRAIN_PROBE_WINDOW_S`` seconds: **idle** (the
recorder's drain thread held by ``Recorder.stop``; what the scheduler submits waits in its queue)
and **busy** (the drain thread started again; the window counts only from the moment its backlog
is drained, records and sinks, so what it measures is the drain keeping pace with the steps).  The stop's own
synchronous drain and the busy window's catch-up are marked as transitions (mode -1), not counted.

With ``CTXPROF_DRAIN_PROBE_MODE=process`` the drain runs in a process of its own instead (the
design this prices; ``bench/drain_child.py``): the recorder's drain thread stays held, a child
process (``drain_child``: a recorder, aggregator and default sinks, as the session's) reads a socket,
and in busy windows the scheduler thread itself hands each step's queued items over at the start of
the next ``run_batch`` (``drain_child.Forwarder.after_step``: plain facts, pickled, one write).
``ring``: the same child fed through a shared-memory ring instead (``bench/drain_ring.py``: the
facts as ``marshal`` bytes, no system call per step).  In thread mode ``CTXPROF_DRAIN_PROBE_ARMS``
(e.g. ``paced,batched``) takes the busy windows in turn with the drain of an accelerator
(``paced``: ``pacing.for_device("cuda")``, slices and looks at the steps' pace; the CPU's before it
had its own), the same with no pause between its slices (``whole``), and the CPU device's
(``batched``: ``for_device("cpu")``, whole looks every 80 ms at least), each arm's pacer and looks
kept across its windows; the windows are marked 1, 2, ... by arm.

At the start of each window and of its counted part, the window thread also notes the drain's CPU
time and records so far (the recorder's ``Cost``; in process mode the hand-off's CPU on the
scheduler thread and the items it handed over).  When the file ``<folder>/dump`` appears, it
leaves the drain running, writes the samples and notes to ``<folder>/samples-<pid>.json`` and
ends.  A benchmark's probe, not part of the package.
"""

from __future__ import annotations

import json
import os
import threading
import time

ENV = "CTXPROF_DRAIN_PROBE"
WINDOW_ENV = "CTXPROF_DRAIN_PROBE_WINDOW_S"
MODE_ENV = "CTXPROF_DRAIN_PROBE_MODE"  # "thread" (the recorder's drain thread) or "process"
ARMS_ENV = "CTXPROF_DRAIN_PROBE_ARMS"  # thread mode's busy windows in turn: "paced", "whole", "batched"
IDLE, BUSY, TRANSITION = 0, 1, -1


def _runq_ns() -> int:
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])


def register() -> None:
    out = os.environ.get(ENV)
    if not out:
        return
    from sglang.srt.managers.scheduler import Scheduler

    orig = Scheduler.run_batch
    samples: list[tuple] = []
    state = {"mode": TRANSITION, "window": 0, "thread": None, "forward": None}
    wall, cpu = time.perf_counter_ns, time.thread_time_ns

    def run_batch(self, batch, *args, **kwargs):
        if state["thread"] is None:
            state["thread"] = t = threading.Thread(target=_windows, args=(out, samples, state),
                                                   name="drain-probe", daemon=True)
            t.start()
        fw = state["forward"]
        if fw is not None:  # process mode, a busy window: hand the last step over (counted in its interval)
            fw.after_step()
        decode = bool(batch is not None and batch.forward_mode.is_decode())
        size = batch.batch_size() if batch is not None else 0
        samples.append((state["mode"], state["window"], decode, size, wall(), cpu(), _runq_ns()))
        return orig(self, batch, *args, **kwargs)

    Scheduler.run_batch = run_batch


def _recorder():
    from sglang_ctxprof.collect import hooks

    while hooks.SESSION is None:
        time.sleep(0.1)
    return hooks.SESSION.profiler.recorder


def _child(rec, mode: str):
    """Process and ring modes: the drain process, and the scheduler thread's hand-off to it."""
    import socket
    import subprocess
    import sys
    from multiprocessing.connection import Connection

    bench = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if mode == "ring":
        sys.path.insert(0, bench)
        from drain_ring import Ring, RingForwarder

        path = f"/dev/shm/ctxprof-drain-ring-{os.getpid()}"
        ring = Ring(path, create=True)
        code = f"import sys; sys.path.insert(0, {bench!r}); import drain_ring; drain_ring.ring_child({path!r})"
        return RingForwarder(rec._q, ring, subprocess.Popen([sys.executable, "-c", code]))
    ours, theirs = socket.socketpair()
    code = (f"import sys; sys.path.insert(0, {bench!r}); from multiprocessing.connection import Connection; "
            f"import drain_child; drain_child.drain_child(Connection({theirs.fileno()}))")
    subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),))
    theirs.close()
    sys.path.insert(0, bench)
    from drain_child import Forwarder

    return Forwarder(rec._q, Connection(ours.detach()), thread=False)


def _drain_of(arm: str) -> tuple:
    """An arm's pacer and looks: ``paced`` an accelerator's, ``whole`` the same without pauses,
    ``batched`` the CPU device's."""
    from sglang_ctxprof.collect.pacing import for_device

    pacer, looks = for_device("cpu" if arm == "batched" else "cuda")
    if arm == "whole":
        pacer.backlog = -1  # never a pause
    return pacer, looks


def _windows(out: str, samples: list, state: dict) -> None:
    rec = _recorder()
    window_s = float(os.environ.get(WINDOW_ENV, "3"))
    dump = os.path.join(out, "dump")
    marks: list[tuple] = []  # (window, mode, drain CPU ns, records drained) as each mode begins
    fw = None
    if os.environ.get(MODE_ENV, "thread") in ("process", "ring"):
        rec.stop()  # held for good: the child drains
        fw = _child(rec, os.environ[MODE_ENV])

    def mark(mode: int) -> None:
        state["mode"] = mode
        marks.append((state["window"], mode, *((fw.ns, fw.records) if fw is not None else
                                              (rec.cost.drain_ns, rec.cost.drain_records))))

    arms = os.environ.get(ARMS_ENV, "paced").split(",")
    drains = {name: _drain_of(name) for name in arms}  # each arm's pacer and looks, across its windows
    busy = 0
    idle = True
    while not os.path.exists(dump):
        mark(TRANSITION)
        state["window"] += 1
        t0 = time.monotonic()
        if fw is not None:
            state["forward"] = None  # first: the stop's flush and the scheduler thread never both take the queue
            rec.stop()  # again: the session starts its drain thread at its first step
            state["forward"] = None if idle else fw
            while not idle and rec._q and time.monotonic() - t0 < window_s:  # the held window's backlog
                time.sleep(0.005)
        elif idle:
            rec.stop()
        else:
            rec.pacer, rec.looks = drains[arms[busy % len(arms)]]  # a stopped thread: the next reads them
            rec.start()
            while (rec._q or rec._fan) and time.monotonic() - t0 < window_s:  # the held window's backlog
                time.sleep(0.005)
        mark(IDLE if idle else BUSY + (busy % len(arms) if fw is None else 0))
        busy += not idle
        time.sleep(window_s)
        idle = not idle
    mark(TRANSITION)
    if fw is None:
        rec.start()
    path = os.path.join(out, f"samples-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        parts = {k: v / max(1, fw.records) for k, v in fw.parts.items()} if fw is not None else {}
        health = fw.health() if hasattr(fw, "health") else {}
        json.dump({"window_s": window_s, "samples": samples, "marks": marks, "handoff_per_item": parts,
                   "child": health}, f)
    os.replace(path + ".tmp", path)
