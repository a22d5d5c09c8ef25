"""Graphs on the simulated device (``fake_cuda``): ``CUDAGraph()`` and ``torch.cuda.graph(...)``.

* :class:`FakeGraph` holds branches of captured nodes (kernels, static writes, event records by
  *handle*, cross-branch waits, launch-time host calls).  :meth:`FakeGraph.replay` re-launches them
  on the current stream and one side stream per branch.  A record node whose handle now belongs to
  another event (the captured one was destroyed and its handle recycled) records into that event,
  silently, as the H200 did (probe P6), and counts in ``device.stray_records``.
* :class:`GraphCapture` is the capture context: entering makes the stream capture into the graph;
  a stream that waits on it joins as a branch.  Leaving ends the capture of every branch and, like
  CUDA, fails when a side stream that forked from the capture was never joined back
  (``cudaErrorStreamCaptureUnjoined``).  Nested captures on one stream fail too.

The device object is passed in (``FakeDevice``); this module imports nothing of ``fake_cuda``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional




class FakeGraph:
    """Branches of nodes: ``("kernel", ms)``, ``("set", v)``, ``("record", (handle, serial))``,
    ``("wait", (branch, position))``.  Branch 0 is the stream the capture began on."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.branches: list[list[tuple[str, Any]]] = [[]]
        self.streams: list[Optional[Any]] = [None]  # capture-time stream of each branch
        self.joined: dict[int, int] = {}  # branch -> nodes of it branch 0 has waited for
        self.replays = 0
        self._side: list[Any] = []  # replay-time streams of branches 1.. (one set per graph)
        self.pool: Any = None

    @property
    def nodes(self) -> list[tuple[str, Any]]:
        return [n for br in self.branches for n in br]

    def events(self) -> int:
        return sum(1 for k, _ in self.nodes if k == "record")

    def replay(self) -> None:
        dev = self.device
        self.replays += 1
        main = dev.current
        while len(self._side) < len(self.branches) - 1:
            self._side.append(dev.Stream(f"graph-branch-{len(self._side) + 1}"))
        streams = [main] + self._side
        base = [s.launched for s in streams]
        for i in range(1, len(self.branches)):  # every branch starts after the launch point
            dev._enqueue(streams[i], "wait", (main, base[0]))
            base[i] += 1
        for i, br in enumerate(self.branches):
            for kind, arg in br:
                if kind == "wait":
                    b, pos = arg
                    dev._enqueue(streams[i], "wait", (streams[b], base[b] + pos))
                elif kind == "record":
                    handle, serial = arg
                    ref = dev._live.get(handle)
                    ev = ref() if ref is not None else None
                    if ev is None:
                        continue  # a destroyed event's handle, not reused: nothing visible
                    if ev.serial != serial:
                        dev.stray_records += 1  # the handle now belongs to another event: it is overwritten
                    dev._enqueue_record(ev, streams[i], node=True)
                elif kind == "launch":
                    arg()
                else:
                    dev._enqueue(streams[i], kind, arg)
        for i in range(1, len(self.branches)):  # the launch completes when every branch has
            dev._enqueue(main, "wait", (streams[i], streams[i].launched))

    def reset(self) -> None:
        self.branches = [[]]


class GraphCapture:
    def __init__(self, device: Any, graph: Any, pool: Any, stream: Optional[Any]) -> None:
        """``device``: a ``fake_cuda.FakeDevice``; ``graph``: its ``FakeGraph``; ``stream``: a ``FakeStream``."""
        self.device = device
        self.graph = graph
        self.graph.pool = pool
        self.stream = stream

    def __enter__(self) -> Any:
        dev = self.device
        self._ctx = dev.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        self._ctx.__enter__()
        s = dev.current
        if s.capture is not None:
            raise RuntimeError("nested capture")
        s.capture = self.graph
        self.graph.streams[0] = s
        dev.capturing += 1
        return self.graph

    def __exit__(self, *exc: Any) -> None:
        g = self.graph
        dev = self.device
        dev.capturing -= 1
        spoiled, dev.spoiled = dev.spoiled, dev.spoiled and dev.capturing > 0
        try:
            for s in g.streams:
                if s is not None:
                    s.capture = None
            if exc[0] is None and spoiled:
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture "
                                   "(cudaErrorStreamCaptureInvalidated)")
            if exc[0] is None:
                for br in range(1, len(g.branches)):
                    if g.joined.get(br, -1) < len(g.branches[br]):
                        raise RuntimeError("capture ended with an unjoined side stream "
                                           "(cudaErrorStreamCaptureUnjoined)")
        finally:
            self._ctx.__exit__(*exc)
