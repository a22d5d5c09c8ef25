"""The device behind ``gpu_probe.py``: ``torch.cuda`` itself, or the simulated device (``--dry-run``).

Both expose the ``torch.cuda`` names the probes use (``Event``, ``Stream``, ``stream``,
``current_stream``, ``CUDAGraph``, ``graph``, ``graph_pool_handle``, ``synchronize``,
``is_current_stream_capturing``) plus three kernels: ``tiny()`` (one ``x.add_(1)``), ``spin(ms)``
(``torch.cuda._sleep`` for about ``ms`` milliseconds) and ``block()`` (a small matmul, the probes'
stand-in for an attention or MoE block).  torch only; no SGLang.
"""

from __future__ import annotations

import contextlib


class TorchCuda:
    dry = False

    def __init__(self):
        import torch

        c = torch.cuda
        self.t = torch
        self.Event, self.Stream, self.stream = c.Event, c.Stream, c.stream
        self.current_stream, self.CUDAGraph, self.graph = c.current_stream, c.CUDAGraph, c.graph
        self.graph_pool_handle, self.synchronize = c.graph_pool_handle, c.synchronize
        self.is_current_stream_capturing = c.is_current_stream_capturing
        self.name = c.get_device_name()
        props = c.get_device_properties(c.current_device())
        khz = getattr(props, "clock_rate", None)  # kHz: cycles per ms
        self.cycles_per_ms = int(khz) if khz else 1_980_000
        self.x = torch.zeros(1, device="cuda")
        self.a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)

    def tiny(self):
        self.x.add_(1)

    def spin(self, ms):
        self.t.cuda._sleep(int(ms * self.cycles_per_ms))

    def block(self):
        self.a = (self.a @ self.a).mul_(0.01)

    def memory(self):
        return self.t.cuda.memory_allocated()


class FakeCuda:
    """The simulated device (``sglang_ctxprof.testing.fake_cuda``), 2 µs per in-graph event node."""

    dry = True
    name = "fake (dry run)"

    def __init__(self, record_cost_ms=0.002):
        from sglang_ctxprof.testing.fake_cuda import FakeDevice

        d = self.d = FakeDevice(record_cost_ms=record_cost_ms)
        self.Event, self.Stream, self.stream = d.Event, d.Stream, d.stream
        self.current_stream, self.CUDAGraph = d.current_stream, d.CUDAGraph
        self.graph_pool_handle, self.synchronize = d.graph_pool_handle, d.synchronize
        self.is_current_stream_capturing = d.is_current_stream_capturing

    def graph(self, cuda_graph=None, pool=None, stream=None):
        return self.d.graph(cuda_graph, pool=pool, stream=stream)

    def tiny(self):
        self.d.kernel(0.003)

    def spin(self, ms):
        self.d.kernel(ms)

    def block(self):
        self.d.kernel(0.05)

    def memory(self):
        return 0


def make(dry):
    return FakeCuda() if dry else TorchCuda()


def outcome(fn):
    """``{"value": fn()}`` or ``{"raises": "Type: message"}``: what a call did, never an exception."""
    try:
        v = fn()
        return {"value": v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)}
    except Exception as exc:  # noqa: BLE001 - the probe records what the device did
        return {"raises": f"{type(exc).__name__}: {str(exc)[:300]}"}


@contextlib.contextmanager
def nullctx():
    yield
