"""The two devices of ``gpu_check.py`` behind one small interface: the real GPU (torch only) and
the simulated one (``sglang_ctxprof.testing.fake_cuda``, for ``--dry-run``).

Each has ``Event``, ``is_capturing()``, ``capture(holder)`` (a context manager that captures a CUDA
graph into ``holder["g"]``), ``synchronize()`` (used by the benchmark itself, never by the code under
test), and the model's blocks: ``attn`` (q.K^T, softmax, .V over a KV cache), ``moe`` (router, top-2
of E experts), ``rest`` (output projection) and ``busy`` (a large matmul that keeps the GPU ahead
of the CPU, so eager block events measure kernels, not launch gaps).
"""

from __future__ import annotations

import contextlib


class FakeDev:
    name = "fake (dry run)"

    def __init__(self, record_cost_ms=0.0):
        from sglang_ctxprof.testing.fake_cuda import FakeDevice

        self.d = FakeDevice(record_cost_ms=record_cost_ms)
        self.Event = self.d.Event

    def memory(self):
        return 0

    def is_capturing(self):
        return self.d.is_current_stream_capturing()

    @contextlib.contextmanager
    def capture(self, holder):
        with self.d.graph() as g:
            holder["g"] = g
            yield

    def synchronize(self):
        self.d.run()  # the bench itself may wait; the hot path never does (checked via d.syncs)

    def attn(self, blk):
        self.d.kernel(0.8)

    def moe(self, blk):
        self.d.kernel(0.6)

    def rest(self, blk):
        self.d.kernel(0.1)

    def busy(self):
        self.d.kernel(2.0)


class TorchDev:
    def __init__(self, ctx, bs, heads, dim, hidden, experts):
        import torch

        self.t = torch
        self.name = torch.cuda.get_device_name()
        self.Event = torch.cuda.Event
        kw = dict(device="cuda", dtype=torch.bfloat16)
        self.q = torch.randn(bs * heads, 4, dim, **kw)  # 4 draft tokens per request
        self.k = torch.randn(bs * heads, ctx, dim, **kw)
        self.v = torch.randn(bs * heads, ctx, dim, **kw)
        self.x = torch.randn(bs * 4, hidden, **kw)
        self.router = torch.randn(hidden, experts, **kw)
        self.w1 = torch.randn(experts, hidden, 2 * hidden, **kw) * 0.01
        self.w2 = torch.randn(experts, 2 * hidden, hidden, **kw) * 0.01
        self.wo = torch.randn(heads * dim, hidden, **kw) * 0.01
        self.big = torch.randn(8192, 8192, **kw)
        self.bs, self.heads = bs, heads

    def is_capturing(self):
        return self.t.cuda.is_current_stream_capturing()

    def memory(self):
        return self.t.cuda.memory_allocated()

    def capture(self, holder):
        holder["g"] = self.t.cuda.CUDAGraph()
        return self.t.cuda.graph(holder["g"])

    def synchronize(self):
        self.t.cuda.synchronize()

    def attn(self, blk):
        s = self.t.softmax(self.q @ self.k.transpose(1, 2) * 0.088, dim=-1)
        self.o = s @ self.v

    def moe(self, blk):
        t = self.t
        gate = t.softmax(self.x @ self.router, dim=-1)
        w, idx = t.topk(gate, 2, dim=-1)
        mask = t.zeros_like(gate).scatter(1, idx, w)  # [T, E], zero for unselected experts
        h = t.relu(t.einsum("th,ehf->etf", self.x, self.w1))
        y = t.einsum("etf,efh->eth", h, self.w2)
        self.y = (y * mask.t().unsqueeze(-1)).sum(0)

    def rest(self, blk):
        self.z = self.o.reshape(self.bs * 4, -1) @ self.wo

    def busy(self):  # keeps the GPU ahead of the CPU so eager block events see no launch gaps
        self.big @ self.big


