"""A simulated CUDA device (one stream, events, graphs) for CPU tests and ``gpu_check --dry-run``.

It models exactly the properties our GPU timing code relies on, so those code paths run on
machines without a GPU through the same interface as ``torch.cuda``:

* work is *launched* (queued) by the host and *executed* later by :meth:`FakeDevice.run`;
  ``Event.record()`` enqueues a timestamp, ``Event.query()`` is True only once the device ran it,
  ``Event.elapsed_time()`` raises (like CUDA) if either event has not completed;
* during graph capture, launches go into the graph instead of the queue; a record of an event
  created with ``external=True`` becomes a node that re-fires on every replay, while a record of
  a plain event is *not* a timing node (its ``elapsed_time`` raises, as on real CUDA);
* ``replay()`` enqueues the captured nodes again, so the events of the previous replay are
  overwritten when the device reaches them;
* a kernel's duration may be a function of the device's *static input* (``set_static`` enqueues a
  write, as the host copies a step's inputs into a graph's static buffers), so replays of the same
  graph take step-dependent times and a read of the wrong replay shows up as a wrong number;
* every ``synchronize()`` is counted, so tests can prove the read path never synchronizes.

``supports_external=False`` builds a device whose ``Event`` rejects ``external=`` with a
``TypeError`` (older PyTorch), to exercise the feature detection and fallback.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional


class FakeEvent:
    def __init__(self, device: "FakeDevice", enable_timing: bool = False, external: bool = False) -> None:
        self.device = device
        self.enable_timing = enable_timing
        self.external = external
        self.time_ms: Optional[float] = None  # set when the device executes the record
        self.pending = 0  # launched but not yet executed records
        self.invalid = False  # recorded during capture without external=True

    def record(self, stream: Any = None) -> None:
        self.device._launch_record(self)

    def query(self) -> bool:
        self.device.queries += 1
        return self.pending == 0 and (self.time_ms is not None or self.invalid)

    def elapsed_time(self, end: "FakeEvent") -> float:
        for ev in (self, end):
            if ev.invalid:
                raise RuntimeError("elapsed_time on an event recorded during capture without external=True")
            if ev.time_ms is None or ev.pending:
                raise RuntimeError("elapsed_time before the event completed (cudaErrorNotReady)")
        return float(end.time_ms - self.time_ms)

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.run()


class FakeGraph:
    def __init__(self, device: "FakeDevice") -> None:
        self.device = device
        self.nodes: list[tuple[str, Any]] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for kind, arg in self.nodes:
            if kind == "kernel":
                self.device._queue.append(("kernel", arg))
            else:
                arg.pending += 1
                self.device._queue.append(("record", arg))


class FakeDevice:
    """One in-order stream with a simulated clock (milliseconds)."""

    def __init__(self, supports_external: bool = True) -> None:
        self.supports_external = supports_external
        self.now_ms = 0.0
        self.static: Any = 0
        self._queue: deque = deque()
        self._capture: Optional[FakeGraph] = None
        self.syncs = 0
        self.queries = 0
        self.created = 0
        dev = self

        class Event(FakeEvent):
            def __init__(self, enable_timing: bool = False, **kw: Any) -> None:
                if "external" in kw and not dev.supports_external:
                    raise TypeError("Event.__init__() got an unexpected keyword argument 'external'")
                dev.created += 1
                super().__init__(dev, enable_timing=enable_timing, external=bool(kw.get("external", False)))

        self.Event = Event

    # ---- host side -----------------------------------------------------------------------------
    def kernel(self, ms: "float | Callable[[Any], float]") -> None:
        """Launch a kernel taking ``ms`` (or ``ms(static_input)``) milliseconds on the device."""
        if self._capture is not None:
            self._capture.nodes.append(("kernel", ms))
        else:
            self._queue.append(("kernel", ms))

    def set_static(self, value: Any) -> None:
        """Enqueue a write of the static input buffer (executes in stream order)."""
        self._queue.append(("set", value))

    def _launch_record(self, ev: FakeEvent) -> None:
        if self._capture is not None:
            if ev.external:
                self._capture.nodes.append(("record", ev))
            else:
                ev.invalid = True  # a fork/join dependency in real CUDA, never a timing node
            return
        ev.pending += 1
        self._queue.append(("record", ev))

    def is_current_stream_capturing(self) -> bool:
        return self._capture is not None

    def graph(self) -> "_Capture":
        return _Capture(self)

    def synchronize(self) -> None:
        self.syncs += 1
        self.run()

    # ---- device side ---------------------------------------------------------------------------
    def run(self, max_ops: Optional[int] = None) -> int:
        """Execute up to ``max_ops`` queued operations (all by default); return how many ran."""
        n = 0
        while self._queue and (max_ops is None or n < max_ops):
            kind, arg = self._queue.popleft()
            if kind == "kernel":
                self.now_ms += float(arg(self.static) if callable(arg) else arg)
            elif kind == "set":
                self.static = arg
            else:
                arg.time_ms = self.now_ms
                arg.pending -= 1
            n += 1
        return n

    @property
    def idle(self) -> bool:
        return not self._queue


class _Capture:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.graph = FakeGraph(device)

    def __enter__(self) -> FakeGraph:
        if self.device._capture is not None:
            raise RuntimeError("nested capture")
        self.device._capture = self.graph
        return self.graph

    def __exit__(self, *exc: Any) -> None:
        self.device._capture = None


def factory(device: FakeDevice, **kw: Any) -> Callable[[], FakeEvent]:
    return lambda: device.Event(enable_timing=True, **kw)
