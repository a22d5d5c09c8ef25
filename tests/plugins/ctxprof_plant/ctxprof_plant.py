"""Test-only SGLang plugin: plant known causes of slow decode, switched at run time from a file.

``CTXPROF_PLANT_FILE`` names a JSON file the test rewrites between phases (re-read when its mtime
changes, so one server serves every planted case):

* ``attn_ms_per_1k``: extra time in every verify attention call, proportional to the batch's summed
  context (``forward_batch.seq_lens_sum``): an attention slowdown that grows with context;
* ``attn_work_per_1k``: extra *work* in every verify attention call: a busy-wait on the thread's CPU
  clock of ``x`` times the call's own CPU time per 1k tokens of the batch's summed context, so the
  verify attention path runs ``1 + x * ctx / 1000`` times as long as without it.  Proportional to
  the kernel's own time, it is the same slowdown on a fast machine and a slow one, and a busy
  machine stretches it as it stretches the kernel (a sleep stays fixed while the steps around it
  stretch): ratios of the planted path to the others hold at any load;
* ``acc_len_above``: ``[ctx, acc_len]`` - at batches whose summed context is above ``ctx``, SGLang's
  own ``SGLANG_SIMULATE_ACC_LEN`` is set to ``acc_len`` for the next verify (``eagle_utils`` reads
  ``spec_utils.SIMULATE_ACC_LEN`` at every call): acceptance that falls with context;
* ``host_sleep_ms``: a sleep in the scheduler loop after each ``get_next_batch_to_run`` that gives
  a batch: a host bubble before every step that runs;
* ``slow_steps``: ``[ms, n]`` - the next ``n`` target-verify forwards after the file changed each
  sleep ``ms`` once, in their first attention call, inside a ``torch.profiler.record_function``
  range named ``ctxprof_plant.slow_step`` (so a profiler trace shows where the planted work ran);
  ``_STATE["planted"]`` counts them.
* ``host_spin_ms``: the same delay as a busy-wait (the core stays busy and its caches warm, so the
  steps around it run as without it);
* ``stall_steps`` / ``stall_ms``: the next ``stall_steps`` verify steps after the file changes each
  stall ``stall_ms`` in their first attention layer: a few slow steps, as a kernel compiling costs.

The attention wrapper sits on the intel_amx backend's ``forward_extend``/``forward_decode`` (called
inside ``RadixAttention.forward``), so the planted time is inside the profiler's verify attention.
"""

from __future__ import annotations

import json
import os
import time

ENV = "CTXPROF_PLANT_FILE"
_STATE = {"mtime": None, "cfg": {}, "left": 0, "batch": None, "planted": 0, "stalled": 0}
SLOW_RANGE = "ctxprof_plant.slow_step"


def cfg() -> dict:
    path = os.environ.get(ENV, "")
    try:
        m = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    if m != _STATE["mtime"]:
        try:
            with open(path) as f:
                _STATE["cfg"] = json.load(f)
        except (OSError, ValueError):
            _STATE["cfg"] = {}
        _STATE["mtime"] = m
        _STATE["left"] = int((_STATE["cfg"].get("slow_steps") or (0, 0))[1])
        _STATE["stalled"] = 0
    return _STATE["cfg"]


def _wrap_attn(cls, name):
    orig = getattr(cls, name)

    def wrapper(self, q, k, v, layer, forward_batch, *args, **kwargs):
        c = cfg()
        mode = getattr(forward_batch, "forward_mode", None)
        if mode is not None and mode.is_target_verify():
            ctx = int(getattr(forward_batch, "seq_lens_sum", 0) or 0)
            per_1k = float(c.get("attn_ms_per_1k", 0.0) or 0.0)
            if per_1k > 0:
                time.sleep(per_1k * ctx / 1000.0 / 1000.0)
            work = float(c.get("attn_work_per_1k", 0.0) or 0.0) * ctx / 1000.0
            if getattr(layer, "layer_id", None) == 0 and _STATE["stalled"] < int(c.get("stall_steps", 0) or 0):
                _STATE["stalled"] += 1
                time.sleep(float(c.get("stall_ms", 0.0) or 0.0) / 1000.0)
            above = c.get("acc_len_above")
            from sglang.srt.speculative import spec_utils

            spec_utils.SIMULATE_ACC_LEN = float(above[1]) if above and ctx > int(above[0]) else -1.0
            if _STATE["left"] > 0 and _STATE["batch"] is not forward_batch:
                _STATE["batch"] = forward_batch
                _STATE["left"] -= 1
                _STATE["planted"] += 1
                import torch

                with torch.profiler.record_function(SLOW_RANGE):
                    time.sleep(float(c["slow_steps"][0]) / 1000.0)
            if work > 0:
                t0 = time.thread_time()
                out = orig(self, q, k, v, layer, forward_batch, *args, **kwargs)
                end = time.thread_time() + work * (time.thread_time() - t0)
                while time.thread_time() < end:
                    pass
                return out
        return orig(self, q, k, v, layer, forward_batch, *args, **kwargs)

    setattr(cls, name, wrapper)


def register() -> None:
    if not os.environ.get(ENV):
        return
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend
    from sglang.srt.managers.scheduler import Scheduler

    _wrap_attn(IntelAMXAttnBackend, "forward_extend")
    _wrap_attn(IntelAMXAttnBackend, "forward_decode")
    orig = Scheduler.get_next_batch_to_run

    def get_next_batch_to_run(self, *args, **kwargs):
        batch = orig(self, *args, **kwargs)
        c = cfg()
        ms = float(c.get("host_sleep_ms", 0.0) or 0.0)
        spin = float(c.get("host_spin_ms", 0.0) or 0.0)
        if (ms > 0 or spin > 0) and batch is not None:  # before every step that runs, a request's first decode too
            if ms > 0:
                time.sleep(ms / 1000.0)
            end = time.perf_counter() + spin / 1000.0
            while time.perf_counter() < end:
                pass
        return batch

    Scheduler.get_next_batch_to_run = get_next_batch_to_run
