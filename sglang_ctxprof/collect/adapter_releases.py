"""Which SGLang releases sglang-ctxprof supports, and what each supported release lacks.

Part of the adapter (the only modules that know SGLang's internals): the tables here are what
start-up prints (``plugin``), what ``sglang-ctxprof patch`` and ``make check-compat`` check, and
what the support table in docs/sglang-versions.md says.  ``compat_check``'s tests hold ``RELEASE_LIMITS`` equal to the
optional hook targets each cached wheel really lacks.
"""

from __future__ import annotations

from typing import Optional

from . import block_adapter as _block

# Every release since the plugin framework took its current shape: all required targets resolve
# (``make check-compat``); what an older release lacks is in RELEASE_LIMITS below.
SUPPORTED = tuple(f"0.5.{minor}" for minor in range(13, 24))

_S = "sglang.srt.managers.scheduler.Scheduler"
_FROZEN_DRAFT = "sglang.srt.speculative.frozen_kv_mtp_worker_v2.FrozenKVMTPDraftWorker"
_RB = "sglang.srt.model_executor.runner_backend"

# Optional targets that a supported release lacks, and what the user loses there.  This table is
# the one place where supported releases differ; compat_check's tests hold it equal to the wheels.
_GRAPH_LOST = ("no runner_backend CUDA-graph backends: under CUDA graphs the verify split "
               "(attention / MoE) is reported unavailable; eager and CPU runs are unaffected")
RELEASE_LIMITS: dict[str, dict[str, str]] = {
    "0.5.13": {
        f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one": _GRAPH_LOST,
        f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.replay": _GRAPH_LOST,
        f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.cleanup": _GRAPH_LOST,
        f"{_RB}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.replay": _GRAPH_LOST,
        f"{_RB}.tc_piecewise_cuda_graph_backend.TcPiecewiseCudaGraphBackend.replay": _GRAPH_LOST,
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture":
            _GRAPH_LOST,
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph":
            "no eager fallback for sampled verify steps (SGLANG_CTXPROF_GRAPH_FALLBACK=eager)",
        f"{_FROZEN_DRAFT}.draft": "the FrozenKV MTP worker does not exist yet",
        f"{_FROZEN_DRAFT}._draft_extend_for_decode": "the FrozenKV MTP worker does not exist yet",
    },
}
_OVERLAP_LOST = ("Scheduler.is_disable_overlap_for_batch takes (self, batch): no overlap gate, so "
                 "in-graph split events are read only where SGLang itself runs without overlap")
for _v in ("0.5.13", "0.5.14", "0.5.15"):
    RELEASE_LIMITS.setdefault(_v, {})[f"{_S}.is_disable_overlap_for_batch"] = _OVERLAP_LOST

# Scheduler.send_abort_output (adapter_ends) is new in 0.5.23; earlier releases report an abort inline.
_ABORT_LOST = ("no Scheduler.send_abort_output: a request aborted while it waits in SGLang's queue "
               "stays unfinished in the request history until evicted, and requests_aborted stays 0")
for _v in SUPPORTED[:SUPPORTED.index("0.5.23")]:
    RELEASE_LIMITS.setdefault(_v, {})[f"{_S}.send_abort_output"] = _ABORT_LOST

for _v, _lost in _block.release_limits(13).items():
    RELEASE_LIMITS.setdefault(_v, {}).update(_lost)


def release_limits(version: Optional[str]) -> list[str]:
    """What a supported release lacks, one line per distinct effect (empty for the newest)."""
    return sorted(set(RELEASE_LIMITS.get(version or "", {}).values()))


# Releases we know and do not support, with the exact reason (shown at start-up and by compat_check).
UNSUPPORTED: dict[str, str] = {
    "0.5.12": ("TpModelWorker.forward_batch_generation takes (self, model_worker_batch, ...) "
               "instead of (self, batch), so verify is not hooked; with --disable-overlap-schedule "
               "0.5.12 runs the V1 workers (eagle_worker.EAGLEWorker, ...) whose draft/draft-extend "
               "seams are not in our target table; FrozenKVMTPDraftWorker does not exist; ranks come "
               "from Scheduler attributes (no runtime_context). Found by the offline AST check "
               "(make check-compat); run-time support was not attempted"),
}
NO_PLUGIN_FRAMEWORK = ("SGLang {version} has no plugin framework (sglang.srt.plugins, added in 0.5.12); "
                       "sglang-ctxprof cannot load. Use SGLang {supported}")


def support_message(version: Optional[str], has_framework: bool = True) -> Optional[str]:
    """None for a supported release, else the one-line reason shown at start-up."""
    sup = ", ".join(SUPPORTED)
    if not has_framework:
        return NO_PLUGIN_FRAMEWORK.format(version=version, supported=sup)
    if version in SUPPORTED:
        return None
    if version in UNSUPPORTED:
        return (f"SGLang {version} is not supported: {UNSUPPORTED[version]}; profiling what can be "
                f"hooked (supported: {sup})")
    return (f"SGLang {version} is not a tested release ({sup}); checking every hook target, "
            f"profiling what can be hooked")


def sglang_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001
        return None
