"""SGLang's ``SchedulerProfilerManager`` reduced to what ctxprof's capture (``collect.capture``)
relies on, and a scheduler that ticks a capture once per step.

``_profile(ProfileReq)`` starts a profiler object held in ``torch_profiler`` and sets
``profile_in_progress``; ``_stop_profile()`` calls the profiler's ``stop()`` and then
``export_chrome_trace(path)`` with a ``<prefix>-<profile_id>-TP-0.trace.json.gz`` path, then, if
``torch_profiler`` is still set, drops it and runs ``gc.collect()`` (counted in ``collected``), and
clears ``profile_in_progress``.  Between the export and the drop SGLang waits at
``torch.distributed.barrier`` for every rank of the TP group: here counted in ``barriers``, which a
test of several ranks compares step by step (a rank that reaches it alone hangs the group).
``wait_state`` waits for a capture's worker to finish it.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from types import SimpleNamespace

from ..collect.capture import Capture, CaptureInfo
from ..model import names


class FakeTorchProfiler:
    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def export_chrome_trace(self, path: str) -> None:
        assert self.stopped
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 2.0}],
                       "baseTimeNanoseconds": 0, "pad": os.urandom(4000).hex()}, f)  # ~4.3 kB gzipped


class FakeProfilerManager:
    def __init__(self) -> None:
        self.torch_profiler: FakeTorchProfiler | None = None
        self.profile_in_progress = False
        self.out_dir = ""
        self.profile_id = ""
        self.collected = 0
        self.barriers = 0  # torch.distributed.barrier(dp_tp_cpu_group) calls in _stop_profile
        self.dp_tp_cpu_group = "dp_tp_cpu_group"  # SGLang's: get_dp_tp_group().cpu_group

    def _profile(self, req):
        if self.profile_in_progress:
            return SimpleNamespace(success=False, message="Profiling is already in progress.")
        self.out_dir, self.profile_id, self.prefix = req.output_dir, req.profile_id, req.profile_prefix
        self.activities = req.activities
        self.torch_profiler = FakeTorchProfiler()
        self.profile_in_progress = True
        return SimpleNamespace(success=True, message="Succeeded")

    def _stop_profile(self):
        assert self.torch_profiler is not None, "stop without a started profiler"
        self.torch_profiler.stop()
        self.torch_profiler.export_chrome_trace(
            os.path.join(self.out_dir, f"{self.prefix}-{self.profile_id}-TP-0.trace.json.gz"))
        self.barriers += 1
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # a test that models the TP group's ranks
            dist.barrier(self.dp_tp_cpu_group)
        if self.torch_profiler is not None:  # SGLang: drop the profiler and gc.collect()
            self.torch_profiler = None
            self.collected += 1
        self.profile_in_progress = False


class CaptureScheduler:
    """The scheduler a capture ticks on: a profiler manager, ``forward_ct`` and ``server_args``."""

    def __init__(self) -> None:
        self.profiler_manager = FakeProfilerManager()
        self.forward_ct = 0
        self.server_args = SimpleNamespace(device="cpu", tp_size=1, pp_size=1)

    def step(self, cap: Capture, rids=("a",), prefill: bool = False) -> None:
        """One ``run_batch``: a decode batch of ``rids`` (SGLang's running requests), or their prefill."""
        mode = SimpleNamespace(is_decode=lambda: not prefill, is_extend=lambda: prefill,
                               is_target_verify=lambda: False)
        batch = SimpleNamespace(reqs=[SimpleNamespace(rid=r) for r in rids], seq_lens_sum=100 * len(rids),
                                forward_mode=mode)
        if cap.armed:
            cap.tick(self, batch)
        self.forward_ct += 1


def wait_state(cap: Capture, cid: str, timeout: float = 120.0) -> CaptureInfo:
    """Capture ``cid`` once it is done, failed or deleted (AssertionError after ``timeout`` s: a hang
    guard, not a speed bound; the first export in a process takes ~10 s on a loaded 2-core machine)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        c = cap.find(cid)
        if c is not None and c.state in (names.CAPTURE_DONE, names.CAPTURE_FAILED, names.CAPTURE_DELETED):
            return c
        time.sleep(0.01)
    raise AssertionError(cap.find(cid))
