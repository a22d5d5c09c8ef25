"""A shared-memory ring for a drain process's hand-off: no pickle and no system call per step.

The scheduler thread (``RingForwarder.after_step``) turns each queued step into its plain facts
(``HostFacts.facts``), writes their state as ``marshal`` bytes (a rank as a plain tuple) into a
ring in a shared-memory file, and moves the ring's write position; the drain process
(``ring_child``) looks every ``POLL_S``, reads what is new, rebuilds the facts and feeds its
recorder.  One writer, one reader: the positions are counters that only grow (x86 keeps the
writer's stores in order), an entry is its length (4 bytes) and its bytes, a wrap is a marker; a
full ring drops the step (counted).  Anything other than a step's facts (a request's end, a loss
mark) goes pickled.  Used by ``bench/drain_server.py --mode ring``; a design priced, not the package's.
"""

from __future__ import annotations

import marshal
import mmap
import os
import pickle
import struct
import time
from collections import Counter

HEAD = 16  # the write position (u64), then the read position (u64)
WRAP = 0xFFFFFFFF
POLL_S = 0.005


class Ring:
    def __init__(self, path: str, size: int = 8 << 20, create: bool = False) -> None:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            size = os.fstat(fd).st_size
            self.m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.cap = size - HEAD
        self.dropped = 0

    def put(self, data: bytes) -> bool:
        m, cap, need = self.m, self.cap, 4 + len(data)
        w, r = struct.unpack_from("<QQ", m, 0)
        off = w % cap
        skip = cap - off if off + need > cap else 0
        if w + skip + need - r > cap:
            self.dropped += 1
            return False
        if skip:
            if skip >= 4:
                struct.pack_into("<I", m, HEAD + off, WRAP)
            w, off = w + skip, 0
        struct.pack_into("<I", m, HEAD + off, len(data))
        m[HEAD + off + 4:HEAD + off + need] = data
        struct.pack_into("<Q", m, 0, w + need)  # last: the reader sees the entry whole
        return True

    def take(self) -> list[bytes]:
        m, cap, out = self.m, self.cap, []
        w, r = struct.unpack_from("<QQ", m, 0)
        while r < w:
            off = r % cap
            n = struct.unpack_from("<I", m, HEAD + off)[0] if cap - off >= 4 else WRAP
            if n == WRAP:
                r += cap - off
                continue
            out.append(m[HEAD + off + 4:HEAD + off + 4 + n])
            r += 4 + n
        struct.pack_into("<Q", m, 8, r)
        return out


def encode(item) -> bytes:
    """A queued item as ring bytes: a step's plain facts (``HostFacts.facts``, or facts already) as
    ``marshal`` bytes, anything else pickled."""
    from sglang_ctxprof.collect.host import HostFacts
    from sglang_ctxprof.model.facts import StepFacts

    f = item.facts() if type(item) is HostFacts else item
    if type(f) is not StepFacts:
        return b"P" + pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL)
    state = [(v.tp, v.dp, v.pp) if n == "rank" else v for n, v in zip(f.__slots__, f.__getstate__())]
    return b"F" + marshal.dumps(tuple(state))


def decode(data: bytes):
    from sglang_ctxprof.model.facts import StepFacts
    from sglang_ctxprof.model.records import RankId

    if data[:1] == b"P":
        return pickle.loads(data[1:])
    state = marshal.loads(data[1:])
    f = StepFacts.__new__(StepFacts)
    f.__setstate__(tuple(RankId(*v) if n == "rank" else v for n, v in zip(StepFacts.__slots__, state)))
    return f


class RingForwarder:
    """The scheduler thread's side: ``after_step`` hands what its recorder queued over to the ring."""

    def __init__(self, q, ring: Ring, child=None) -> None:
        self.q, self.ring, self.child = q, ring, child
        self.ns = self.records = 0
        self.parts: Counter = Counter()  # CPU ns: the plain facts, marshal, the ring write; bytes; drops

    def after_step(self) -> None:
        from sglang_ctxprof.collect.host import HostFacts

        tt, q, parts = time.thread_time_ns, self.q, self.parts
        t0 = tt()
        while q:
            item = q.popleft()
            if type(item).__name__ == "_Started":  # a record the thread drain had begun: its rest here
                while not item.step():
                    pass
                continue
            a = tt()
            item = item.facts() if type(item) is HostFacts else item
            b = tt()
            data = encode(item)
            c = tt()
            parts["dropped"] += not self.ring.put(data)  # the child is not keeping up (or gone)
            parts["facts"] += b - a
            parts["marshal"] += c - b
            parts["write"] += tt() - c
            parts["bytes"] += len(data)
            self.records += 1
        self.ns += tt() - t0

    def health(self) -> dict:
        """Whether the child drained: the ring's bytes written and read so far, and the child alive."""
        w, r = struct.unpack_from("<QQ", self.ring.m, 0)
        return {"ring_written": w, "ring_read": r, "child_alive": self.child is not None and self.child.poll() is None}


def ring_child(path: str) -> None:
    """The drain process (``drain_child.child_profiler``), fed what the ring holds, every ``POLL_S``,
    until the parent is gone."""
    from drain_child import child_profiler, feed

    p = child_profiler()
    ring, parent = Ring(path), os.getppid()
    os.unlink(path)  # the mapping stays: nothing is left in /dev/shm once both processes end
    while os.getppid() == parent:
        feed(p, [decode(data) for data in ring.take()])
        time.sleep(POLL_S)
