"""A simulated CUDA device (streams, events, graphs) for CPU tests and the ``--dry-run`` GPU kits.

It models the properties our GPU timing code relies on, through the same names as ``torch.cuda``
(``Event``, ``Stream``, ``stream(s)``, ``current_stream()``, ``graph(...)``, ``CUDAGraph()``,
``graph_pool_handle()``, ``synchronize()``, ``is_current_stream_capturing()``, ``_sleep``):

* work is *launched* by the host onto a stream and *executed* later by the device: :meth:`run`
  executes every ready operation, :meth:`advance` only what one event or stream needs (the lazy
  device: another stream's later work stays pending).  Streams order work; ``wait_stream`` and
  ``wait_event`` order work across streams.  One device clock (ms) advances with every kernel;
* ``Event.query()`` answers like ``c10/cuda/CUDAEvent.h``: True for an event never recorded, False
  while a record is pending, and it *raises* for a plain event recorded during capture (that record
  is only a fork/join marker, never a timing node).  ``elapsed_time`` raises ``ValueError`` unless
  both events have ``enable_timing`` and were recorded, ``RuntimeError`` unless both completed;
* capture is per stream: a stream that waits on a capturing stream joins the capture as a branch
  (global capture mode), and must be joined back before the capture ends.  A record of an event
  created with ``external=True`` becomes a node that re-fires on every replay;
* a graph keeps *handles* of its events, not the events: as in CUDA (``CUDAGraph.h`` holds no event
  reference) the Python object is the only owner.  Handles are recycled, and a replay records into
  whatever event holds the handle now, without an error: the H200 did exactly that (probe P6,
  2026-12-04); such records are counted in ``stray_records``;
* an event node replayed from a graph costs device time (``record_cost_ms``, default 0; eager records are free);
* a kernel's duration may be a function of the device's *static input* (``set_static`` enqueues a
  write, as the host copies a step's inputs into a graph's static buffers), so replays of the same
  graph take step-dependent times and a read of the wrong replay shows up as a wrong number;
* every ``synchronize()`` the code under test calls is counted (``syncs``); :meth:`advance` is the
  harness's own wait (SGLang's ``copy_done.synchronize()``) and is not counted;
* while any stream captures (``torch.cuda.graph``'s global capture mode), what CUDA forbids then
  raises as it does: a device, stream or event ``synchronize()``, and an event or stream
  ``query()`` (``cudaErrorStreamCaptureUnsupported``), and the capture then ends in an error
  (``cudaErrorStreamCaptureInvalidated``), whoever caught the first;
* ``concurrent=True`` gives each stream its own clock: a kernel starts when its stream and every
  stream it waits on have got there, so work on two streams overlaps in time as on a GPU (the
  default is one serial clock, where nothing overlaps);
* :meth:`on_launch` queues a host call made when the work is *launched*: at once outside a capture,
  on every replay inside one (``fake_comm`` pairs in-graph collectives across ranks with it).

``supports_external=False`` builds a device whose ``Event`` rejects ``external=`` with a
``TypeError`` (older PyTorch), to exercise the feature detection and fallback.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from typing import Any, Callable, Iterator, Optional

from .fake_graph import FakeGraph, GraphCapture


class FakeEvent:
    def __init__(self, device: "FakeDevice", enable_timing: bool = False, external: bool = False) -> None:
        self.device = device
        self.enable_timing = enable_timing
        self.external = external
        self.handle = device._new_handle(self)
        self.serial = device._serial  # which event object, when a recycled handle is shared over time
        self.time_ms: Optional[float] = None  # set when the device executes a record
        self.pending = 0  # launched but not yet executed records
        self.recorded = False  # some record was launched (eagerly or by a replay)
        self.in_graph = False  # a node of some captured graph
        self.captured_plain = False  # recorded during capture without external=True
        self.last: Optional[tuple["FakeStream", int]] = None  # (stream, seq) of the latest record
        self._capture_pos: Optional[tuple["FakeGraph", int, int]] = None  # where a capture recorded it

    def record(self, stream: Optional["FakeStream"] = None) -> None:
        self.device._record(self, stream or self.device.current)

    def query(self) -> bool:
        self.device._not_capturing("cudaEventQuery")
        self.device.queries += 1
        if self.captured_plain:
            raise RuntimeError("CUDA error: invalid argument (event recorded during stream capture "
                               "without external=True)")
        return self.pending == 0

    def elapsed_time(self, end: "FakeEvent") -> float:
        self.device.elapsed_calls += 1
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        for ev in (self, end):
            if ev.captured_plain:
                raise RuntimeError("CUDA error: invalid argument (event recorded during capture "
                                   "without external=True)")
            if not ev.recorded and not ev.in_graph:
                raise ValueError("Both events must be recorded before calculating elapsed time.")
            if not ev.recorded:  # a graph node never replayed: the H200 answers so (probe P1)
                raise RuntimeError("CUDA error: invalid resource handle")
            if ev.pending or ev.time_ms is None:
                raise RuntimeError("CUDA error: device not ready (cudaErrorNotReady)")
        start_ms, end_ms = self.time_ms, end.time_ms
        if start_ms is None or end_ms is None:  # checked above: both events have run
            raise RuntimeError("CUDA error: device not ready (cudaErrorNotReady)")
        return float(end_ms - start_ms)

    def synchronize(self) -> None:
        self.device._not_capturing("cudaEventSynchronize")
        self.device.syncs += 1
        self.device.advance(self)

    def __del__(self) -> None:
        dev = getattr(self, "device", None)
        h = getattr(self, "handle", None)
        if dev is not None and h in dev._live:
            del dev._live[h]
            if getattr(self, "pending", 0):  # CUDA frees it once its launched records completed
                dev._draining[h] = self.pending
            else:
                dev._free.append(h)


class FakeStream:
    def __init__(self, device: "FakeDevice", name: str = "") -> None:
        self.device = device
        self.name = name
        self.q: deque = deque()  # (op, arg), in launch order
        self.launched = 0
        self.done = 0
        self.capture: Optional["FakeGraph"] = None
        self.t_ms = 0.0  # this stream's clock (concurrent devices)
        self.done_at: list[float] = []  # stream time at which each executed operation completed

    def wait_stream(self, other: "FakeStream") -> None:
        self.device._wait(self, other, len_of=True)

    def wait_event(self, ev: FakeEvent) -> None:
        self.device._wait(self, ev, len_of=False)

    def query(self) -> bool:
        self.device._not_capturing("cudaStreamQuery")
        return self.done == self.launched

    def synchronize(self) -> None:
        self.device._not_capturing("cudaStreamSynchronize")
        self.device.syncs += 1
        self.device._advance(self, self.launched)


class FakeDevice:
    """Streams and graphs on one simulated device clock (milliseconds)."""

    def __init__(self, supports_external: bool = True, record_cost_ms: float = 0.0,
                 concurrent: bool = False) -> None:
        self.supports_external = supports_external
        self.record_cost_ms = record_cost_ms
        self.concurrent = concurrent
        self.now_ms = 0.0
        self.static: Any = 0
        self.syncs = 0
        self.capturing = 0  # captures under way (GraphCapture)
        self.spoiled = False  # a forbidden call came during them: they end in an error
        self.queries = 0
        self.elapsed_calls = 0
        self.created = 0
        self._handles = 0
        self._serial = 0
        self._live: dict[int, Any] = {}
        self._free: list[int] = []  # handles of destroyed events, reused first (as CUDA's pool does)
        self._draining: dict[int, int] = {}  # destroyed with records still pending: handle -> how many
        self.stray_records = 0
        self.streams: list[FakeStream] = []
        self.default_stream = self.Stream("default")
        self.current = self.default_stream
        dev = self

        class Event(FakeEvent):
            def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                         **kw: Any) -> None:
                if "external" in kw and not dev.supports_external:
                    raise TypeError("Event.__init__() got an unexpected keyword argument 'external'")
                dev.created += 1
                super().__init__(dev, enable_timing=enable_timing, external=bool(kw.get("external", False)))

        self.Event = Event

    # ---- torch.cuda-shaped host API -------------------------------------------------------------
    def Stream(self, name: str = "") -> FakeStream:  # noqa: N802 - mirrors torch.cuda.Stream
        s = FakeStream(self, name or f"stream-{len(self.streams)}")
        self.streams.append(s)
        return s

    def current_stream(self) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, s: Optional[FakeStream]) -> Iterator[None]:
        prev = self.current
        self.current = s or prev
        try:
            yield
        finally:
            self.current = prev

    def CUDAGraph(self) -> FakeGraph:  # noqa: N802
        return FakeGraph(self)

    def graph_pool_handle(self) -> object:
        return object()

    def graph(self, cuda_graph: Optional[FakeGraph] = None, pool: Any = None,
              stream: Optional[FakeStream] = None) -> Any:
        return GraphCapture(self, cuda_graph or FakeGraph(self), pool, stream)

    def is_current_stream_capturing(self) -> bool:
        return self.current.capture is not None

    def synchronize(self) -> None:
        self._not_capturing("cudaDeviceSynchronize")
        self.syncs += 1
        self.run()

    def _not_capturing(self, call: str) -> None:
        """Global capture mode: ``call`` while any stream captures is an error (from any thread), and
        every capture under way is spoiled: it ends with ``cudaErrorStreamCaptureInvalidated``."""
        if self.capturing:
            self.spoiled = True
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({call}: "
                               "cudaErrorStreamCaptureUnsupported)")

    def kernel(self, ms: "float | Callable[[Any], float]") -> None:
        """Launch a kernel taking ``ms`` (or ``ms(static_input)``) milliseconds on the current stream."""
        self._op(self.current, "kernel", ms)

    def _sleep(self, cycles: int) -> None:  # torch.cuda._sleep: a spin kernel (1 GHz: 1e6 cycles = 1 ms)
        self.kernel(cycles / 1e6)

    def on_launch(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when this point of the stream is launched: now, or on each replay of a capture."""
        s = self.current
        if s.capture is not None:
            s.capture.branches[self._branch(s)].append(("launch", fn))
        else:
            fn()

    def set_static(self, value: Any) -> None:
        """Enqueue a write of the static input buffer (executes in stream order)."""
        self._op(self.current, "set", value)

    # ---- launches ---------------------------------------------------------------------------------
    def _new_handle(self, ev: FakeEvent) -> int:
        self._serial += 1
        if self._free:
            h = self._free.pop()
        else:
            self._handles += 1
            h = self._handles
        self._live[h] = weakref.ref(ev)
        return h

    def _branch(self, s: FakeStream) -> int:
        g = s.capture
        if g is None:
            raise RuntimeError("stream is not capturing")
        return g.streams.index(s)

    def _op(self, s: FakeStream, kind: str, arg: Any) -> None:
        if s.capture is not None:
            s.capture.branches[self._branch(s)].append((kind, arg))
        else:
            self._enqueue(s, kind, arg)

    def _enqueue(self, s: FakeStream, kind: str, arg: Any) -> None:
        s.q.append((kind, arg))
        s.launched += 1

    def _enqueue_record(self, ev: FakeEvent, s: FakeStream, node: bool = False) -> None:
        ev.pending += 1
        ev.recorded = True
        self._enqueue(s, "node" if node else "record", ev.handle)
        ev.last = (s, s.launched)

    def _record(self, ev: FakeEvent, s: FakeStream) -> None:
        g = s.capture
        if g is None:
            ev.captured_plain = False
            self._enqueue_record(ev, s)
            return
        br = self._branch(s)
        if ev.external:
            ev.in_graph = True
            g.branches[br].append(("record", (ev.handle, ev.serial)))
        else:  # a fork/join marker inside the capture, never a timing node
            ev.captured_plain = True
        ev.last = (s, -1 - len(g.branches[br]))  # negative: a position in the capture of ``s``
        ev._capture_pos = (g, br, len(g.branches[br]))

    def _wait(self, s: FakeStream, src: Any, len_of: bool) -> None:
        if len_of:
            other: FakeStream = src
            if other.capture is not None:
                self._capture_wait(s, other.capture, self._branch(other), len(other.capture.branches[
                    self._branch(other)]))
                return
            target = (other, other.launched)
        else:
            pos = getattr(src, "_capture_pos", None)
            if src.captured_plain and pos is not None:
                g, br, n = pos
                self._capture_wait(s, g, br, n)
                return
            if src.last is None:
                return  # waiting on an event never recorded is a no-op
            target = src.last
        if s.capture is not None:
            raise RuntimeError("capture waits on work outside the capture (cudaErrorStreamCaptureIsolation)")
        self._enqueue(s, "wait", target)

    def _capture_wait(self, s: FakeStream, g: FakeGraph, br: int, pos: int) -> None:
        if s.capture is None:  # a stream waiting on a capturing stream joins the capture (fork)
            s.capture = g
            g.branches.append([])
            g.streams.append(s)
        elif s.capture is not g:
            raise RuntimeError("wait across two captures")
        mine = self._branch(s)
        g.branches[mine].append(("wait", (br, pos)))
        if mine == 0:
            g.joined[br] = max(g.joined.get(br, 0), pos)

    # ---- device side -------------------------------------------------------------------------------
    def _ready(self, s: FakeStream) -> bool:
        kind, arg = s.q[0]
        if kind != "wait":
            return True
        other, seq = arg
        return other.done >= seq

    def _exec(self, s: FakeStream) -> None:
        kind, arg = s.q.popleft()
        conc = self.concurrent
        if conc:  # the stream's own clock, never behind the work it waited for
            if kind == "wait" and arg[1] > 0:
                s.t_ms = max(s.t_ms, arg[0].done_at[arg[1] - 1])
            self.now_ms = s.t_ms
        if kind == "kernel":
            self.now_ms += float(arg(self.static) if callable(arg) else arg)
        elif kind == "set":
            self.static = arg
        elif kind in ("record", "node"):
            ref = None if arg in self._draining else self._live.get(arg)
            ev = ref() if ref is not None else None
            if arg in self._draining:  # a destroyed event's pending record completes, then frees it
                self._draining[arg] -= 1
                if not self._draining[arg]:
                    del self._draining[arg]
                    self._free.append(arg)
            if ev is not None:
                ev.time_ms = self.now_ms
                ev.pending -= 1
            if kind == "node":  # an event node in a graph serializes the graph: it costs time
                self.now_ms += self.record_cost_ms
        if conc:
            s.t_ms = self.now_ms
            s.done_at.append(s.t_ms)
        s.done += 1

    def run(self, max_ops: Optional[int] = None) -> int:
        """Execute up to ``max_ops`` ready operations (all by default), first ready stream first."""
        n = 0
        progress = True
        while progress and (max_ops is None or n < max_ops):
            progress = False
            for s in self.streams:
                if s.q and self._ready(s):
                    self._exec(s)
                    n += 1
                    progress = True
                    break
        return n

    def _advance(self, s: FakeStream, seq: int) -> None:
        while s.done < seq and s.q:
            kind, arg = s.q[0]
            if kind == "wait" and arg[0].done < arg[1]:
                self._advance(arg[0], arg[1])
            self._exec(s)

    def advance(self, ev: FakeEvent) -> None:
        """Execute what ``ev``'s latest record needs and nothing more (SGLang's own wait; not counted)."""
        if ev.last is not None and ev.last[1] >= 0:
            self._advance(*ev.last)

    @property
    def idle(self) -> bool:
        return not any(s.q for s in self.streams)


def factory(device: FakeDevice, **kw: Any) -> Callable[[], FakeEvent]:
    return lambda: device.Event(enable_timing=True, **kw)
