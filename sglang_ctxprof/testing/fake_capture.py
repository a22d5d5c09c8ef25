"""``torch.cuda.graph(...)`` on the simulated device: begin and end a capture on a stream.

Entering makes the stream (``stream=`` or the current one) capture into the graph; a stream that
waits on it joins as a branch (``fake_cuda``).  Leaving ends the capture of every branch, and,
like CUDA, fails when a side stream that forked from the capture was never joined back
(``cudaErrorStreamCaptureUnjoined``).  Nested captures on one stream fail too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional


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
        return self.graph

    def __exit__(self, *exc: Any) -> None:
        g = self.graph
        try:
            for s in g.streams:
                if s is not None:
                    s.capture = None
            if exc[0] is None:
                for br in range(1, len(g.branches)):
                    if g.joined.get(br, -1) < len(g.branches[br]):
                        raise RuntimeError("capture ended with an unjoined side stream "
                                           "(cudaErrorStreamCaptureUnjoined)")
        finally:
            self._ctx.__exit__(*exc)
