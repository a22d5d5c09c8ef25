"""The one place that knows SGLang's internals (0.5.13 - 0.5.23).

Everything version-specific lives here: the table of hook targets, how to read ranks, sequence
lengths, acceptance and the control request/reply types.  The hooks call these helpers and never
touch SGLang attributes directly, so supporting another release means editing this module only.

Reads happen where SGLang has already synchronized the step (``process_batch_result`` after
``copy_done.synchronize()``): ``accept_lens`` is then a CPU tensor, ``req.seqlen`` and
``len(req.output_ids)`` are plain Python values.  Nothing here touches a GPU tensor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from ..model.records import RankId

logger = logging.getLogger(__name__)

# Every release since the plugin framework took its current shape: all required targets resolve
# (``make check-compat``); what an older release lacks is in RELEASE_LIMITS below.
SUPPORTED = tuple(f"0.5.{minor}" for minor in range(13, 24))

_S = "sglang.srt.managers.scheduler.Scheduler"
_EAGLE_DRAFT = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"
_NGRAM = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
_MLE_DRAFT = "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker"
_FROZEN_DRAFT = "sglang.srt.speculative.frozen_kv_mtp_worker_v2.FrozenKVMTPDraftWorker"
_RB = "sglang.srt.model_executor.runner_backend"


@dataclass(frozen=True)
class Target:
    """One hook target: dotted path, the hook kind (see ``hooks.HOOKS``), and whether it must exist."""

    path: str
    hook: str
    required: bool = True
    group: str = "timing"  # "timing" targets toggle with enable/disable; "control" stays


TARGETS: tuple[Target, ...] = (
    Target(f"{_S}.get_internal_state", "control", group="control"),
    Target(f"{_S}.run_batch", "run_batch"),
    Target(f"{_S}.process_batch_result", "process_batch_result"),
    Target("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", "verify"),
    Target(f"{_EAGLE_DRAFT}.draft", "draft"),
    Target(f"{_EAGLE_DRAFT}._draft_extend_for_decode", "draft_extend"),
    Target(f"{_NGRAM}._prepare_for_speculative_decoding", "draft"),
    Target(f"{_NGRAM}._update_ngram_corpus", "draft_extend"),
    Target(f"{_MLE_DRAFT}.draft", "draft", required=False),
    Target(f"{_MLE_DRAFT}._draft_extend_for_decode", "draft_extend", required=False),
    Target(f"{_FROZEN_DRAFT}.draft", "draft", required=False),
    Target(f"{_FROZEN_DRAFT}._draft_extend_for_decode", "draft_extend", required=False),
    Target("sglang.srt.layers.radix_attention.RadixAttention.forward", "attn"),
    Target("sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.forward", "moe"),
    # Whole MoE blocks (gate + top-k + experts + shared experts) of the model families we know.
    # Only the outermost MoE region of a call counts, so FusedMoE inside them is not double-counted.
    Target("sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward", "moe", required=False),
    Target("sglang.srt.models.qwen3_moe.Qwen3MoeSparseMoeBlock.forward", "moe", required=False),
    Target("sglang.srt.models.qwen2_moe.Qwen2MoeSparseMoeBlock.forward", "moe", required=False),
    # CUDA graphs (graph_timing): capture records external events around the blocks above; each
    # replay attaches them to a sampled verify step or marks its split unavailable; the overlap
    # gate makes the scheduler read a sampled step before the next replay; the optional eager
    # fallback runs sampled verify steps without their graph.  No-ops on CPU.
    Target(f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one", "graph_capture", required=False),
    Target(f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.replay", "graph_replay", required=False),
    Target(f"{_RB}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.replay", "graph_replay",
           required=False),
    # verify may also run in the piecewise prefill graph (torch.compile): no in-graph events there, so
    # the split of such a step is reported unavailable rather than as eager attention with MoE = 0.
    Target(f"{_RB}.tc_piecewise_cuda_graph_backend.TcPiecewiseCudaGraphBackend.replay", "graph_replay",
           required=False),
    Target(f"{_S}.is_disable_overlap_for_batch", "overlap_gate", required=False),
    Target("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph",
           "graph_eager_fallback", required=False),
)

# What each target needs from the hooked function's signature (checked at start-up and by the
# offline AST compatibility check): parameter names that must be present, in order.
SIGNATURES: dict[str, tuple[str, ...]] = {
    f"{_S}.get_internal_state": ("self", "recv_req"),
    f"{_S}.run_batch": ("self", "batch"),
    f"{_S}.process_batch_result": ("self", "batch", "result"),
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": ("self", "batch"),
}


# The plugin framework itself: without it SGLang never calls our entry point (releases <= 0.5.1).
FRAMEWORK: tuple[str, ...] = (
    "sglang.srt.plugins.load_plugins",
    "sglang.srt.plugins.hook_registry.HookRegistry.register",
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.server_args.ServerArgs.from_cli_args",
)
SIGNATURES.update({
    "sglang.srt.plugins.hook_registry.HookRegistry.register": ("cls", "target", "hook"),
    "sglang.srt.server_args.ServerArgs.add_cli_args": ("parser",),
    "sglang.srt.server_args.ServerArgs.from_cli_args": ("cls", "args"),
})

# Optional targets that a supported release lacks, and what the user loses there.  This table is
# the one place where supported releases differ; compat_check's tests hold it equal to the wheels.
_GRAPH_LOST = ("no runner_backend CUDA-graph backends: under CUDA graphs the verify split "
               "(attention / MoE) is reported unavailable; eager and CPU runs are unaffected")
RELEASE_LIMITS: dict[str, dict[str, str]] = {
    "0.5.13": {
        f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one": _GRAPH_LOST,
        f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.replay": _GRAPH_LOST,
        f"{_RB}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.replay": _GRAPH_LOST,
        f"{_RB}.tc_piecewise_cuda_graph_backend.TcPiecewiseCudaGraphBackend.replay": _GRAPH_LOST,
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


# ---- batch / request / result accessors ---------------------------------------------------------
def batch_kind(batch: Any) -> Optional[str]:
    """'decode' for a decode (speculative or not) step, 'prefill' for extend, None otherwise."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return None
    if mode.is_decode():
        return "decode"
    if mode.is_extend() and not mode.is_target_verify():
        return "prefill"
    return None


def step_id(batch: Any) -> int:
    return int(getattr(batch, "forward_iter", 0) or 0)


def req_snapshot(req: Any) -> tuple[str, int, int, int]:
    """(rid, context length now, spec_verify_ct, tokens emitted so far) for one request."""
    out = req.output_ids
    flen = getattr(req, "finished_len", None)
    emitted = len(out) if flen is None else min(len(out), flen)
    return req.rid, len(req.origin_input_ids) + len(out), int(getattr(req, "spec_verify_ct", 0)), emitted


def req_finished(req: Any) -> bool:
    try:
        return bool(req.finished())
    except Exception:  # noqa: BLE001
        return False


def req_trace_parent(req: Any) -> str:
    """W3C ``traceparent`` of SGLang's own request span, or "" when SGLang is not tracing.

    SGLang 0.5.23 carries the client's ``traceparent`` header to the scheduler only inside
    ``req.time_stats.trace_ctx`` (a ``TraceReqContext`` rebuilt from the tokenizer's pickled state),
    and only with ``--enable-trace``: without it the HTTP process never extracts the header and
    ``trace_ctx`` is a ``TraceNullContext``.  Its ``root_span_context`` holds SGLang's "Req <rid>"
    span, itself a child of the client's trace, so our request span parented here joins both.
    """
    tc = getattr(getattr(req, "time_stats", None), "trace_ctx", None)
    if getattr(tc, "tracing_enable", False) is not True:
        return ""
    ctx = getattr(tc, "root_span_context", None)
    if ctx is None:
        return ""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=ctx)
        return carrier.get("traceparent", "")
    except Exception:  # noqa: BLE001 - no OTel, or a context of another shape: no parent
        return ""


def metrics_enabled(server_args: Any) -> bool:
    """SGLang's ``--enable-metrics`` (its multiprocess Prometheus registry serves /metrics)."""
    return bool(getattr(server_args, "enable_metrics", False))


def served_model_name(server_args: Any) -> str:
    """The model name SGLang's own metrics carry as ``model_name`` (``--served-model-name`` or the path)."""
    return str(getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", "") or "")


def accept_lens(result: Any, n: int) -> list[int]:
    """Tokens accepted per request including the bonus token (CPU values, already synchronized)."""
    al = getattr(result, "accept_lens", None)
    if al is None:
        return [1] * n
    if getattr(al, "is_cpu", True):
        return [int(x) for x in al.tolist()]
    return [0] * n  # never read a device tensor here; report unknown as 0


def draft_tokens(result: Any, server_args: Any) -> int:
    n = getattr(result, "speculative_num_draft_tokens", None)
    if n is None:
        n = getattr(server_args, "speculative_num_draft_tokens", None)
    return int(n or 0)


def algorithm_name(server_args: Any) -> str:
    alg = getattr(server_args, "speculative_algorithm", None)
    return str(alg).upper() if alg else "NONE"


def is_verify_call(args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("is_verify", False))


def rank_of(scheduler: Any) -> RankId:
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return RankId(int(p.tp_rank or 0), int(p.dp_rank or 0), int(p.pp_rank or 0))
    except Exception:  # noqa: BLE001 - older releases keep them on the scheduler
        return RankId(int(getattr(scheduler, "tp_rank", 0) or 0), int(getattr(scheduler, "dp_rank", 0) or 0),
                      int(getattr(scheduler, "pp_rank", 0) or 0))


def device_of(scheduler: Any) -> str:
    return str(getattr(getattr(scheduler, "server_args", None), "device", "cpu") or "cpu")


SIGNATURES.update({
    f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one": ("self", "shape_key", "forward_fn"),
    f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.replay": ("self", "shape_key"),
    f"{_RB}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.replay": ("self", "shape_key"),
    f"{_RB}.tc_piecewise_cuda_graph_backend.TcPiecewiseCudaGraphBackend.replay": ("self", "shape_key"),
    f"{_S}.is_disable_overlap_for_batch": ("self", "batch", "last_batch"),
})


def graph_key(backend: Any, shape_key: Any) -> Any:
    """Key of one captured graph: the backend instance (one per runner) and its shape key."""
    return (id(backend), shape_key)


def batch_step_id(batch: Any) -> Optional[int]:
    """``forward_iter`` of a batch already launched (None for no batch)."""
    if batch is None:
        return None
    it = getattr(batch, "forward_iter", None)
    return int(it) if it is not None else None


def next_step_id(scheduler: Any) -> int:
    """The ``forward_iter`` the batch being launched will get (run_batch increments forward_ct)."""
    return int(getattr(scheduler, "forward_ct", 0) or 0) + 1


def device_name(scheduler: Any) -> Optional[str]:
    """The GPU's marketing name (for the bandwidth table), None on a CPU run."""
    if not device_of(scheduler).startswith("cuda"):
        return None
    try:
        import torch

        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001
        return None


def model_facts(scheduler: Any) -> Optional[dict[str, Any]]:
    """KV-cache layout facts of the target model for the roofline (builtins only), or None."""
    mc = getattr(scheduler, "model_config", None)
    if mc is None:
        return None
    sa = getattr(scheduler, "server_args", None)
    kv_dtype = str(getattr(sa, "kv_cache_dtype", "auto") or "auto")
    if kv_dtype == "auto":
        kv_dtype = str(getattr(mc, "dtype", "bfloat16")).replace("torch.", "")
    from ..model.roofline import dtype_bytes

    facts: dict[str, Any] = {
        "layers": int(getattr(mc, "num_attention_layers", 0) or getattr(mc, "num_hidden_layers", 0)),
        "kv_dtype": kv_dtype, "kv_dtype_bytes": dtype_bytes(kv_dtype),
        "tp_size": int(getattr(scheduler, "tp_size", 1) or 1),
    }
    arch = getattr(mc, "attention_arch", None)  # an IntEnum: str() is "1" on Python 3.11, use .name
    if str(getattr(arch, "name", arch)).upper().endswith("MLA"):
        facts.update(attention="mla", kv_lora_rank=int(mc.kv_lora_rank), qk_rope_head_dim=int(mc.qk_rope_head_dim))
    else:
        hf = getattr(mc, "hf_text_config", None)
        kv = getattr(hf, "num_key_value_heads", None) or getattr(hf, "num_attention_heads", 0)
        facts.update(attention="gqa", num_kv_heads=int(kv), head_dim=int(getattr(mc, "head_dim", 0)))
    return facts


# ---- control channel ------------------------------------------------------------------------------
def control_rid(recv_req: Any) -> Optional[str]:
    rid = getattr(recv_req, "rid", None)
    return rid if isinstance(rid, str) else None


def http_app() -> Any:
    """SGLang's FastAPI app (HTTP process)."""
    from sglang.srt.entrypoints.http_server import app

    return app


def admin_auth() -> Any:
    """SGLang's ADMIN_OPTIONAL auth decorator (``--admin-api-key`` protects what it wraps)."""
    from sglang.srt.utils.auth import AuthLevel, auth_level

    return auth_level(AuthLevel.ADMIN_OPTIONAL)


def tokenizer_manager() -> Any:
    """The HTTP process's tokenizer manager, which carries control requests to the schedulers."""
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state().tokenizer_manager


def make_control_request(rid: str) -> Any:
    from sglang.srt.managers.io_struct import GetInternalStateReq

    return GetInternalStateReq(rid=rid)


def make_control_reply(payload: dict) -> Any:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    return GetInternalStateReqOutput(internal_state=payload)
