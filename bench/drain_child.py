#!/usr/bin/env python3
"""The process modes of ``bench/drain_gil.py``: the drain in a process of its own.

``drain_child`` is the child: a profiler's recorder, aggregator and default sinks (as the session's),
fed the records built from the plain step facts it reads from a pipe.  ``Forwarder`` is the
scheduler process's side: a forwarding thread ('process'), or the scheduler thread itself after
each step ('inline'), turns the recorder's queued host facts into plain facts, pickles them and
writes them to the pipe.  Its CPU time per record is what the scheduler's process still pays.

A benchmark's part, not a test.
"""

from __future__ import annotations

import pickle
import threading
import time


def child_profiler():
    """The drain process's profiler: a recorder, aggregator and default sinks (as the session's),
    its drain thread started."""
    from sglang_ctxprof.collect.profiler import Profiler
    from sglang_ctxprof.model.config import CtxProfConfig
    from sglang_ctxprof.views import exporters

    p = Profiler(CtxProfConfig())
    p.attach_exporters(exporters.install(p.config))
    p.guard.run("exporter", p.exporters.bind, p.bind_facts(None))
    p.recorder.start()
    return p


def feed(p, items) -> None:
    """Hand what the scheduler process sent to ``p``'s recorder: a step's plain facts as the record
    they build, a record or a request's end as it is, a loss mark as one."""
    submit = p.recorder.submit
    for f in items:
        if not hasattr(f, "record"):
            p.recorder.lost() if type(f).__name__ == "_Lost" else submit(f)
            continue
        r = f.record()
        if r is not None:
            submit(r)


def drain_child(conn) -> None:
    """The drain process (``child_profiler``), fed the step facts it receives; ``None`` asks it to
    drain all and answer."""
    p = child_profiler()
    recv = conn.recv_bytes
    while True:
        items = pickle.loads(recv())
        if items is None:
            p.recorder.flush()
            conn.send_bytes(pickle.dumps((p.recorder.submitted, p.aggregator.records)))
        elif items == "stop":
            p.recorder.close()
            return
        else:
            feed(p, items)


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
        from collections import Counter

        self.parts: Counter = Counter()  # CPU ns by part of the hand-off (facts, pickle, send), and bytes
        self.stop_ev = threading.Event()
        self.thread = None
        if thread:  # named as the drain thread it stands in for
            from sglang_ctxprof.collect.recorder import THREAD_NAME

            self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self.thread.start()

    def after_step(self) -> None:
        """No thread ('inline'): the scheduler thread hands the step over itself, after the step."""
        t0 = time.thread_time_ns()
        self._slice(until_empty=True)
        self.ns += time.thread_time_ns() - t0

    def _slice(self, until_empty: bool = False) -> None:
        from sglang_ctxprof.collect.host import HostFacts
        from sglang_ctxprof.collect.pacing import SLICE_NS

        q, pc, out, tt, parts = self.q, time.perf_counter_ns, [], time.thread_time_ns, self.parts
        t0 = pc()
        a = tt()
        while q and (until_empty or pc() - t0 < SLICE_NS):
            item = q.popleft()
            if type(item).__name__ == "_Started":  # a record the thread drain had begun: its rest here
                while not item.step():
                    pass
                continue
            out.append(item.facts() if type(item) is HostFacts else item)
        if out:
            b = tt()
            blob = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
            c = tt()
            self.conn.send_bytes(blob)
            parts["facts"] += b - a
            parts["pickle"] += c - b
            parts["send"] += tt() - c
            parts["bytes"] += len(blob)
            self.records += len(out)

    def _loop(self) -> None:
        from sglang_ctxprof.collect.pacing import PAUSE_S, POLL_S

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
