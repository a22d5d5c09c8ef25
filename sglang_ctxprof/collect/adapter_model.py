"""The adapter's half about the served model: its verify graphs, attention TP size, sparse
attention, hook coverage, and how a step ran (CUDA graph or eager, and why).

Part of :mod:`.adapter` (which re-exports every name here): SGLang internals read to describe the
target model.  ``is_target_verify_graph`` picks the only graphs we time (the target runner's
TARGET_VERIFY graphs), and ``timed_shape_key`` names their timed copies inside the backend.  ``attn_tp_size`` and ``sparse_attention`` feed the roofline's model facts
(``adapter.model_facts``); ``model_coverage`` walks the model's module tree once and says which
attention / MoE classes our hooks cover, for ``/ctx_profile/status``.
"""

from __future__ import annotations

from typing import Any, Optional

from ..model.names import EXEC_EAGER, EXEC_GRAPH, EXEC_REASON_DISABLED


_TIMED = "sglang-ctxprof-timed"


def timed_shape_key(shape_key: Any) -> Any:
    """The shape key under which the backend holds our timed copy of ``shape_key``'s graph."""
    return (_TIMED, shape_key)


def is_timed_shape_key(shape_key: Any) -> bool:
    return isinstance(shape_key, tuple) and len(shape_key) == 2 and shape_key[0] == _TIMED


def has_graph(backend: Any, shape_key: Any) -> bool:
    """The backend holds a captured graph under ``shape_key`` (its ``can_run``'s own test)."""
    graphs = getattr(backend, "_graphs", None)
    return graphs is not None and shape_key in graphs


def is_target_verify_runner(runner: Any) -> bool:
    """A DecodeCudaGraphRunner of the *target* model capturing TARGET_VERIFY (not a draft or
    draft-extend runner, not a plain decode or prefill runner)."""
    mr = getattr(runner, "model_runner", None)
    if mr is None or getattr(mr, "is_draft_worker", True):
        return False
    mode = getattr(runner, "capture_forward_mode", None)
    is_tv = getattr(mode, "is_target_verify", None)
    try:
        return bool(is_tv()) if callable(is_tv) else False
    except Exception:  # noqa: BLE001
        return False


def graph_runner(backend: Any, capturing: Any = None) -> Any:
    """The runner a graph backend belongs to: its ``_cuda_graph_runner`` (0.5.17 on), else the runner
    whose ``capture`` is running (``capturing``: 0.5.16's FullCudaGraphBackend keeps no runner)."""
    return getattr(backend, "_cuda_graph_runner", None) or capturing


def is_target_verify_graph(backend: Any, capturing: Any = None) -> bool:
    """The graph backend belongs to the target's TARGET_VERIFY runner (the only graphs we time)."""
    return is_target_verify_runner(graph_runner(backend, capturing))


# Runners whose graphs are never replayed for the target's verify (UNO's tree draft runs the target
# model in TARGET_VERIFY mode, with a LoRA, as its draft).
_NOT_VERIFY_RUNNERS = ("UnoDecodeCudaGraphRunner",)


def timed_copy_refusal(backend: Any, capturing: Any = None) -> Optional[str]:
    """Why this TARGET_VERIFY backend must get no timed copy, or None.  A second capture of a shape
    reruns the model runner's ``capture_tail_hooks``; a hook that registers the captured graph's
    outputs (DSPARK's verify epilogue: ``static_io[bs] = io``) would then point at the copy's
    buffers, read on unsampled steps too.  Same model, same answer on every rank."""
    runner = graph_runner(backend, capturing)
    name = type(runner).__name__
    if name in _NOT_VERIFY_RUNNERS:
        return f"{name} is not replayed for verify"
    tail = list(getattr(getattr(runner, "model_runner", None), "capture_tail_hooks", None) or ())
    if tail:
        kinds = ", ".join(sorted({getattr(h, "__qualname__", type(h).__name__) for h in tail}))
        return f"the target's capture registers state (capture_tail_hooks: {kinds})"
    return None


def shape_size(shape_key: Any) -> Optional[int]:
    """The captured batch size (tokens or requests) of a graph's shape key, None if unknown."""
    size = getattr(shape_key, "size", shape_key)
    return size if isinstance(size, int) else None


def graph_ranks(backend: Any, capturing: Any = None) -> int:
    """Ranks whose in-graph collectives pair with this backend's graphs (the TP group)."""
    mr = getattr(graph_runner(backend, capturing), "model_runner", None)
    try:
        return max(1, int(getattr(mr, "tp_size", 1) or 1))
    except (TypeError, ValueError):
        return 1


def attn_tp_size(scheduler: Any, tp_size: int) -> int:
    """The attention TP size: tp / attention-DP (/ attention-CP) under --enable-dp-attention."""
    try:
        from sglang.srt.runtime_context import get_parallel

        n = getattr(get_parallel(), "attn_tp_size", None)
        if n:
            return int(n)
    except Exception:  # noqa: BLE001 - older releases, or no parallel context (tests)
        pass
    sa = getattr(scheduler, "server_args", None)
    dp = int(getattr(sa, "dp_size", 1) or 1)
    if getattr(sa, "enable_dp_attention", False) and dp > 1:
        return max(1, tp_size // dp)
    return tp_size


def emits(scheduler: Any) -> bool:
    """Whether ``scheduler`` is the first of the ranks that see its requests: attention TP (and CP)
    peers step the same batch, so only attention rank 0 emits; with DP attention each attention-DP
    group has one (tp rank 0 alone would leave the other groups' requests unexported)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return int(p.attn_tp_rank or 0) == 0 and int(getattr(p, "attn_cp_rank", 0) or 0) == 0
    except Exception:  # noqa: BLE001 - older releases: the layout from the server's arguments
        sa = getattr(scheduler, "server_args", None)
        tp = int(getattr(scheduler, "tp_rank", 0) or 0)
        return tp % attn_tp_size(scheduler, int(getattr(sa, "tp_size", 1) or 1)) == 0


def sparse_attention(mc: Any) -> str:
    """Why attention reads fewer KV bytes than the context ("" when it reads all of it)."""
    hf = getattr(mc, "hf_text_config", None)
    try:
        from sglang.srt.configs.model_config import is_deepseek_dsa

        if hf is not None and is_deepseek_dsa(hf):
            return (f"sparse attention (DSA/NSA, index_topk={getattr(hf, 'index_topk', None)}): each query "
                    "reads its top-k tokens, not the whole context")
    except Exception:  # noqa: BLE001 - older releases have no DSA helper
        pass
    if hf is not None and getattr(hf, "index_topk", None) is not None:
        return f"sparse attention (index_topk={hf.index_topk}): reads its top-k tokens, not the context"
    if getattr(mc, "is_hybrid_swa", False):
        return "hybrid sliding-window attention: windowed layers read only their window"
    if getattr(hf, "use_sliding_window", None) is False:
        return ""
    window = getattr(mc, "sliding_window_size", None) or getattr(hf, "sliding_window", None)
    if window:
        return f"sliding-window attention (window={window}): reads at most the window, not the context"
    if getattr(mc, "attention_chunk_size", None):
        return f"chunked attention (chunk={mc.attention_chunk_size}): reads at most the chunk"
    return ""


def target_model(scheduler: Any) -> Any:
    """The target model (an ``nn.Module``) the scheduler serves, or None."""
    for path in (("tp_worker", "model_runner", "model"), ("model_worker", "target_worker", "model_runner", "model"),
                 ("model_worker", "model_runner", "model")):
        obj = scheduler
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    return None


def _looks_moe(name: str) -> bool:
    low = name.lower()
    return "moe" in low or "experts" in low


def model_coverage(scheduler: Any, model: Any = None, targets: Any = ()) -> dict[str, Any]:
    """Which attention / MoE classes of the served model our hooks cover (walks the module tree once).

    ``attn`` / ``moe``: hooked classes found in the model, with how many instances; ``moe_unhooked``:
    classes that look like MoE (name has "moe"/"experts") whose ``forward`` is not hooked and that
    no hooked MoE block contains: their time falls into ``verify_rest``."""
    from ..model.names import WRAPPER_MARK

    model = model if model is not None else target_model(scheduler)
    if model is None or not hasattr(model, "named_children"):
        return {"available": False, "reason": "no target model found on the scheduler"}
    attn: dict[str, int] = {}
    moe: dict[str, int] = {}
    unhooked: dict[str, int] = {}
    kinds = {t.path.rsplit(".", 2)[-2]: t.hook for t in targets if t.hook in ("attn", "moe")}

    def hooked_kind(mod: Any) -> Optional[str]:
        fwd = getattr(type(mod), "forward", None)
        if not getattr(fwd, WRAPPER_MARK, False):
            return None
        for cls in type(mod).__mro__:
            if cls.__name__ in kinds and "forward" in cls.__dict__:
                return kinds[cls.__name__]
        return None

    def walk(mod: Any, in_moe: bool) -> None:
        name = type(mod).__name__
        kind = hooked_kind(mod)
        if kind == "attn":
            attn[name] = attn.get(name, 0) + 1
        elif kind == "moe":
            moe[name] = moe.get(name, 0) + 1
        elif _looks_moe(name) and not in_moe and "forward" in type(mod).__dict__:
            unhooked[name] = unhooked.get(name, 0) + 1
        for _, child in mod.named_children():
            walk(child, in_moe or kind == "moe")

    walk(model, False)
    return {"available": True, "model": type(model).__name__, "attn": attn, "moe": moe,
            "moe_unhooked": unhooked}


# ---- how a step ran (graph or eager, and why) -----------------------------------------------
def verify_graph_ran(result: Any) -> Optional[bool]:
    """SGLang's ``can_run_cuda_graph`` of a verify/forward result: did the step's target forward
    replay a CUDA graph (full or piecewise)?  None when the result does not say."""
    v = getattr(result, "can_run_cuda_graph", None)
    return None if v is None else bool(v)


def attn_backend(server_args: Any) -> str:
    return str(getattr(server_args, "decode_attention_backend", None)
               or getattr(server_args, "attention_backend", None) or "")


def exec_mode(ran: Optional[bool], server_args: Any, batch_size: int) -> tuple[str, str]:
    """(mode, reason) of a decode/verify step whose :func:`verify_graph_ran` was ``ran``: "graph",
    "eager" (with why, where known) or ""."""
    dev = str(getattr(server_args, "device", "cuda") or "cuda")
    if not dev.startswith("cuda") or getattr(server_args, "disable_cuda_graph", False):
        return EXEC_EAGER, EXEC_REASON_DISABLED
    if ran is None or ran:
        return ("", "") if ran is None else (EXEC_GRAPH, "")
    max_bs = getattr(server_args, "cuda_graph_max_bs", None)
    if isinstance(max_bs, int) and batch_size > max_bs:
        return EXEC_EAGER, f"batch size {batch_size} larger than the largest captured ({max_bs})"
    return EXEC_EAGER, f"the graph runner refused batch size {batch_size} (can_run_cuda_graph False)"


# ---- the step counter the graph hooks read, and the model facts of the roofline ----------------
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


def step_now(scheduler: Any) -> Optional[int]:
    """``forward_ct`` now: every rank advances it once per ``run_batch``, idle batches included."""
    ct = getattr(scheduler, "forward_ct", None)
    return int(ct) if ct is not None else None


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

    tp_size = int(getattr(scheduler, "tp_size", 1) or 1)
    facts: dict[str, Any] = {
        "layers": int(getattr(mc, "num_attention_layers", 0) or getattr(mc, "num_hidden_layers", 0)),
        "kv_dtype": kv_dtype, "kv_dtype_bytes": dtype_bytes(kv_dtype),
        "tp_size": tp_size, "attn_tp_size": attn_tp_size(scheduler, tp_size),
    }
    sparse = sparse_attention(mc)
    if sparse:
        facts["sparse"] = sparse
    arch = getattr(mc, "attention_arch", None)  # an IntEnum: str() is "1" on Python 3.11, use .name
    if str(getattr(arch, "name", arch)).upper().endswith("MLA"):
        facts.update(attention="mla", kv_lora_rank=int(mc.kv_lora_rank), qk_rope_head_dim=int(mc.qk_rope_head_dim))
    else:
        hf = getattr(mc, "hf_text_config", None)
        kv = getattr(hf, "num_key_value_heads", None) or getattr(hf, "num_attention_heads", None) or 0
        facts.update(attention="gqa", num_kv_heads=int(kv), head_dim=int(getattr(mc, "head_dim", 0)))
    return facts
