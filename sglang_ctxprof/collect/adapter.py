"""The one place that knows SGLang's internals (0.5.13 - 0.5.23).

Everything version-specific lives here: the table of hook targets, how to read ranks, sequence
lengths, acceptance and the control request/reply types.  Three sibling modules keep it readable and
follow the same rule: ``adapter_releases`` (which releases are supported and what each lacks),
``adapter_model`` (the served model's graphs, layout and coverage) and ``block_adapter`` (the
block-diffusion drafters' workers).  The hooks call these helpers and never
touch SGLang attributes directly, so supporting another release means editing this module only.

Reads happen where SGLang has already synchronized the step (``process_batch_result`` after
``copy_done.synchronize()``): ``accept_lens`` is then a CPU tensor, ``len(req.output_ids)`` a plain
Python value.  Nothing here touches a GPU tensor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import Any, Optional, Sequence

from ..model.names import CACHED_TOKENS
from ..model.records import RankId
from ..model.rids import short_rid
from . import adapter_ends as _ends
from . import block_adapter as _block
from .adapter_ends import FINISHED_REASON, done_rows, ended_request, mixed_decode_rows, req_finished  # noqa: F401
from .block_adapter import CALL_ORDER, block_size, is_draft_runner, non_draft_tokens  # noqa: F401
from .adapter_releases import _FROZEN_DRAFT, _RB, _S  # noqa: F401
from .adapter_releases import (  # noqa: F401
    NO_PLUGIN_FRAMEWORK, RELEASE_LIMITS, SUPPORTED, UNSUPPORTED, release_limits, sglang_version, support_message)

logger = logging.getLogger(__name__)

_EAGLE_DRAFT = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"
_NGRAM = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
_MLE_DRAFT = "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker"


# Hook kinds installed for the session's lifetime: the control channel, and the CUDA-graph hooks,
# which decide what every rank launches (``graph_hooks``).  Every other kind toggles with timing.
CONTROL_HOOKS = frozenset({"control", "graph_runner_capture", "graph_capture", "graph_replay", "graph_cleanup",
                           "overlap_gate", "graph_eager_fallback"})


@dataclass(frozen=True)
class Target:
    """One hook target: dotted path, the hook kind (see ``session.HOOKS``), whether it must exist,
    and its group, from the kind: ``control`` (stays) or ``timing`` (toggles with enable/disable)."""

    path: str
    hook: str
    required: bool = True
    group: str = ""

    def __post_init__(self) -> None:
        if not self.group:
            object.__setattr__(self, "group", "control" if self.hook in CONTROL_HOOKS else "timing")


TARGETS: tuple[Target, ...] = (
    Target(f"{_S}.get_internal_state", "control"),
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
    # block drafters DFLASH, DSPARK, UNO: their map is in block_adapter
    *(Target(path, hook, required=False) for path, hook in _block.TARGETS + _ends.TARGETS),
    Target("sglang.srt.layers.radix_attention.RadixAttention.forward", "attn"),
    Target("sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.forward", "moe"),
    # Whole MoE blocks (gate + top-k + experts + shared experts) of the model families we know.
    # Only the outermost MoE region of a call counts, so FusedMoE inside them is not double-counted.
    Target("sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward", "moe", required=False),
    Target("sglang.srt.models.qwen3_moe.Qwen3MoeSparseMoeBlock.forward", "moe", required=False),
    Target("sglang.srt.models.qwen2_moe.Qwen2MoeSparseMoeBlock.forward", "moe", required=False),
    # DeepEP's MoE overrides FusedMoE.forward: without this, models with no hooked MoE block would
    # lose their MoE time into verify_rest under --moe-a2a-backend deepep.
    Target("sglang.srt.layers.moe.ep_moe.layer.DeepEPMoE.forward", "moe", required=False),
    # CUDA graphs (graph_clock, graph_hooks; control group): the target's TARGET_VERIFY graphs get a
    # timed copy (captured after SGLang's plain graph, with external events around the blocks
    # above); every rank replays the copy on sampled steps and the plain graph otherwise; cleanup
    # releases the copies' events; the overlap gate holds only when consecutive steps are sampled;
    # the optional eager fallback runs sampled verify steps without their graph.  No-ops on CPU.
    Target("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
           "graph_runner_capture", required=False),
    Target(f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one", "graph_capture", required=False),
    Target(f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.replay", "graph_replay", required=False),
    Target(f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.cleanup", "graph_cleanup", required=False),
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

SIGNATURES.update(_block.SIGNATURES)
SIGNATURES.update(_ends.SIGNATURES)


# ---- batch / request / result accessors ---------------------------------------------------------
def batch_kind(batch: Any) -> Optional[str]:
    """'decode' for a decode (speculative or not) step, 'prefill' for extend, None otherwise.  A
    decode step that DP attention runs as an extend, because a peer rank prefills
    (``ScheduleBatch.convert_decode_to_extend``: every row a 1-token extend, ``decoding_reqs`` the
    batch's own ``reqs``), is a decode step: SGLang keeps no prefill stats for it either."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return None
    if mode.is_decode():
        return "decode"
    if mode.is_extend() and not mode.is_target_verify():
        reqs = getattr(batch, "reqs", None)
        return "decode" if reqs and getattr(batch, "decoding_reqs", None) is reqs else "prefill"
    return None


def step_id(batch: Any) -> int:
    return int(getattr(batch, "forward_iter", 0) or 0)


def req_tracing(req: Any) -> bool:
    """Whether SGLang traces this request (``--enable-trace``; ``/set_trace_level`` can change it)."""
    tc = getattr(getattr(req, "time_stats", None), "trace_ctx", None)
    return getattr(tc, "tracing_enable", False) is True


def req_trace_parent(req: Any) -> str:
    """W3C ``traceparent`` of SGLang's own request span, or "" when SGLang is not tracing.

    SGLang 0.5.23 carries the client's ``traceparent`` header to the scheduler only inside
    ``req.time_stats.trace_ctx`` (a ``TraceReqContext`` rebuilt from the tokenizer's pickled state),
    and only with ``--enable-trace``: without it the HTTP process never extracts the header and
    ``trace_ctx`` is a ``TraceNullContext``.  Its ``root_span_context`` holds SGLang's "Req <rid>"
    span, itself a child of the client's trace, so our request span parented here joins both.
    """
    ctx = getattr(req.time_stats.trace_ctx, "root_span_context", None) if req_tracing(req) else None
    if ctx is None:
        return ""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=ctx)
        return carrier.get("traceparent", "")
    except Exception:  # noqa: BLE001 - no OTel, or a context of another shape: no parent
        return ""


# ---- per-batch arrays: one C-level map(attrgetter) pass per attribute, before and after SGLang
# processes a result; what is fixed while a request runs (rid, prompt) is read on the drain thread.
# In every supported release: output_ids is extended in place while a result is processed (reassigned
# only at init and retraction); finished() is ``finished_reason is not None``; finished_len is set
# only with finished_reason and never changes; spec_verify_ct moves exactly on the rows SGLang counts.
_OUT = attrgetter("output_ids")
_VCT = attrgetter("spec_verify_ct")
_RID = attrgetter("rid")
_PROMPT = attrgetter("origin_input_ids")
_CACHED_OF, _RETRACTIONS_OF = attrgetter(CACHED_TOKENS), attrgetter("retraction_count")


def _vct(reqs: tuple) -> list[int]:
    """``spec_verify_ct`` per request (0 for an object without it)."""
    try:
        return list(map(_VCT, reqs))
    except AttributeError:
        return [int(getattr(r, "spec_verify_ct", 0)) for r in reqs]


def reqs_before(reqs: Any, with_vct: bool, with_done: bool = False
                ) -> tuple[tuple, list, list[int], Optional[list[int]], Optional[list[bool]]]:
    """Before the result is processed: (the requests, their ``output_ids`` objects, the lengths of
    those, ``spec_verify_ct`` per request or None when ``with_vct`` is false, and with ``with_done``
    whether each request had already finished or been retracted, else None).  A non-speculative decode
    under overlap carries such a request for one more step, and SGLang skips its row
    (``process_batch_result_decode``: ``req.finished() or req.is_retracted``); so does a prefill
    (``process_batch_result_prefill``): a running request in a mixed batch that finished at the step
    before, or a chunk in flight when its request was aborted."""
    reqs = tuple(reqs)
    outs = list(map(_OUT, reqs))
    return reqs, outs, list(map(len, outs)), _vct(reqs) if with_vct else None, done_rows(reqs) if with_done else None


def reqs_after(reqs: tuple, outs: list, with_vct: bool) -> tuple[list[int], Optional[list[int]], list[bool]]:
    """After the result is processed: (tokens emitted per request, i.e. ``len(output_ids)`` capped at
    ``finished_len`` when one is set; ``spec_verify_ct`` or None; finished per request)."""
    emitted = list(map(len, outs))
    vct = _vct(reqs) if with_vct else None
    try:
        fin = list(map(is_not, map(FINISHED_REASON, reqs), repeat(None)))
    except AttributeError:  # an object without SGLang's finished_reason: ask finished() itself
        fin = [req_finished(r) for r in reqs]
    if True in fin:  # finished_len is set only on finished requests: visit those alone
        for i in compress(range(len(fin)), fin):
            flen = getattr(reqs[i], "finished_len", None)
            if flen is not None and flen < emitted[i]:
                emitted[i] = flen
    return emitted, vct, fin


def req_ids(reqs: tuple) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(rid, prompt length) per request: fixed while a request runs, so read off the hot path.  The
    rid is the one the profiler keeps (``model.rids.short_rid``: long client rids are capped)."""
    return tuple(map(short_rid, map(_RID, reqs))), tuple(map(len, map(_PROMPT, reqs)))


def correct_drafts(req: Any) -> int:
    """SGLang's own count of a request's accepted drafts (``spec_num_correct_drafts``, the numerator
    of its ``spec_accept_rate``), -1 where the release keeps none.  Read on the drain thread, only for
    finished requests (their counters no longer move)."""
    v = getattr(req, "spec_num_correct_drafts", None)
    return v if isinstance(v, int) else -1


def accept_list(result: Any) -> Optional[list]:
    """``accept_lens`` as a list (tokens accepted per request, bonus included), None when the result
    has none (1 per request, non-speculative), ``[]`` for a device tensor (never read here: 0)."""
    al = getattr(result, "accept_lens", None)
    if al is None:
        return None
    return al.tolist() if getattr(al, "is_cpu", True) else []


def metrics_enabled(server_args: Any) -> bool:
    """SGLang's ``--enable-metrics`` (its multiprocess Prometheus registry serves /metrics)."""
    return bool(getattr(server_args, "enable_metrics", False))


def served_model_name(server_args: Any) -> str:
    """The model name SGLang's own metrics carry as ``model_name`` (``--served-model-name`` or the path)."""
    return str(getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", "") or "")


def draft_tokens(result: Any, server_args: Any) -> int:
    n = getattr(result, "speculative_num_draft_tokens", None)
    if n is None:
        n = getattr(server_args, "speculative_num_draft_tokens", None)
    return int(n or 0)


def draft_depth(draft: int, server_args: Any) -> int:
    """Draft budget in positions, from the step's ``draft_tokens``: draft - 1 (a chain, top-k 1),
    else the tree depth; 0 unknown."""
    if int(getattr(server_args, "speculative_eagle_topk", 1) or 1) > 1:
        return int(getattr(server_args, "speculative_num_steps", 0) or 0)
    return max(0, draft - 1)


def prefill_counts(reqs: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A prefill batch's running totals per request: prefix-cache hits (``req.cached_tokens``) and
    retractions (``req.retraction_count``), in C-level passes; 0 where unknown (then a call each)."""
    try:
        return tuple(map(_CACHED_OF, reqs)), tuple(map(_RETRACTIONS_OF, reqs))
    except AttributeError:
        return tuple(map(req_cached_tokens, reqs)), tuple(map(req_retractions, reqs))


def req_retractions(req: Any) -> int:
    """How often SGLang retracted this request so far (``Req.retraction_count``; 0 when unknown)."""
    v = getattr(req, "retraction_count", 0)
    return v if isinstance(v, int) else 0


def req_cached_tokens(req: Any) -> int:
    """Prompt tokens SGLang found in its prefix cache for this request (0 when unknown)."""
    v = getattr(req, CACHED_TOKENS, 0)
    return v if isinstance(v, int) else 0


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
    f"{_RB}.full_cuda_graph_backend.FullCudaGraphBackend.cleanup": ("self",),
    f"{_RB}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.replay": ("self", "shape_key"),
    f"{_RB}.tc_piecewise_cuda_graph_backend.TcPiecewiseCudaGraphBackend.replay": ("self", "shape_key"),
    f"{_S}.is_disable_overlap_for_batch": ("self", "batch", "last_batch"),
})


def device_name(scheduler: Any) -> Optional[str]:
    """The GPU's marketing name (for the bandwidth table), None on a CPU run."""
    if not device_of(scheduler).startswith("cuda"):
        return None
    try:
        import torch

        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001
        return None


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


# The served model's graphs, parallel layout, sparsity and hook coverage (adapter_model, same rule).
from . import adapter_model as _model  # noqa: E402
from .adapter_model import (  # noqa: E402,F401
    batch_step_id, graph_key, model_facts, next_step_id, step_now,
    attn_backend, attn_tp_size, emits, exec_mode, graph_ranks, has_graph, is_target_verify_graph,
    is_target_verify_runner, is_timed_shape_key, shape_size, sparse_attention, target_model, timed_copy_refusal, timed_shape_key,
    verify_graph_ran)


def model_coverage(scheduler: Any, model: Any = None) -> dict[str, Any]:
    """Which attention / MoE classes of the served model our hooks (``TARGETS``) cover."""
    return _model.model_coverage(scheduler, model, TARGETS)
