"""HBM roofline of verify attention: KV bytes read per step against the device's memory bandwidth.

Pure arithmetic (no SGLang, no torch), used by ``aggregator.summarize`` per context bucket.

* **KV bytes per token** from the model facts (``adapter.model_facts`` reads them from SGLang's
  ``ModelConfig``), for one tensor-parallel rank:

  - MLA (DeepSeek V2/V3, Kimi K2): ``(kv_lora_rank + qk_rope_head_dim) x dtype bytes x layers``;
    the latent cache is replicated on every TP rank;
  - GQA / MHA: ``2 x kv_heads_per_rank x head_dim x dtype bytes x layers`` with
    ``kv_heads_per_rank = max(1, kv_heads // attn_tp)``, where ``attn_tp`` is the *attention* TP
    size (``tp / dp`` under attention data parallelism, ``facts["attn_tp_size"]``).

* **Bytes per step** = bytes per token x the batch's summed context (each request's KV is read
  once per verify step).  A bucket uses the mean summed context of the steps that carry a verify
  attention time (under CUDA graphs only the sampled steps do), so bytes and time come from the
  same steps.
* **Sparse attention** (DSA/NSA top-k, sliding window, chunked) reads fewer bytes than the context:
  ``facts["sparse"]`` holds the reason and the roofline is reported unavailable with it.
* **% of roofline** = (bytes per step / mean verify-attention seconds) / bandwidth x 100.
* **Bandwidth**: a table of known GPUs (matched on the device name) or the override
  ``SGLANG_CTXPROF_HBM_GBPS``.  On a CPU, an unknown GPU or without an attention time the result
  is ``{"available": False, "reason": ...}``, never a made-up number.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .names import ENV_HBM_GBPS

# Peak HBM bandwidth in GB/s (1e9 bytes/s), vendor datasheets.  First match wins (most specific first).
BANDWIDTH_GBPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIE", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM5 80 GB (HBM3)
    ("H200", 4800.0),
    ("B200", 8000.0),
    ("RTX PRO 6000 BLACKWELL", 1792.0),  # GDDR7, 512-bit
)

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp4_e2m1": 0.5}


def dtype_bytes(name: str) -> float:
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {name!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def kv_bytes_per_token(facts: Mapping[str, Any]) -> float:
    """KV-cache bytes one token of context costs one rank to read in one step (all layers)."""
    layers = int(facts["layers"])
    nbytes = float(facts["kv_dtype_bytes"])
    if facts.get("attention") == "mla":
        return (int(facts["kv_lora_rank"]) + int(facts["qk_rope_head_dim"])) * nbytes * layers
    tp = max(1, int(facts.get("attn_tp_size") or facts.get("tp_size", 1) or 1))
    kv_heads = max(1, int(facts["num_kv_heads"]) // tp)
    return 2 * kv_heads * int(facts["head_dim"]) * nbytes * layers


def kv_bytes_per_step(facts: Mapping[str, Any], ctx_sum: float) -> float:
    return kv_bytes_per_token(facts) * float(ctx_sum)


def bandwidth_gbps(device_name: Optional[str], override: Optional[float] = None) -> tuple[Optional[float], str]:
    """(GB/s or None, where it came from / why not).  ``override`` is the configured
    ``SGLANG_CTXPROF_HBM_GBPS`` (parsed and checked by ``model.config``)."""
    if override:
        return float(override), f"override {ENV_HBM_GBPS}"
    if not device_name:
        return None, "no GPU (CPU run): HBM roofline unavailable"
    up = device_name.upper()
    for key, gbps in BANDWIDTH_GBPS:
        if key in up:
            return gbps, f"table: {key.title()}"
    return None, f"unknown GPU {device_name!r}: set {ENV_HBM_GBPS}"


def percent_of_roofline(bytes_per_step: float, attn_ms: float, gbps: float) -> float:
    achieved = bytes_per_step / (attn_ms / 1e3)  # bytes/s
    return 100.0 * achieved / (gbps * 1e9)


def hw_meta(facts: Optional[Mapping[str, Any]], device_name: Optional[str],
            hbm_gbps: Optional[float] = None) -> dict[str, Any]:
    """What a scheduler puts into its state's ``meta["hw"]`` (msgpack-safe builtins)."""
    gbps, source = bandwidth_gbps(device_name, hbm_gbps)
    out: dict[str, Any] = {"device": device_name or "cpu", "hbm_gbps": gbps, "source": source,
                           "model": dict(facts) if facts else None}
    if facts and facts.get("sparse"):
        out["unavailable"] = str(facts["sparse"])
    elif facts:
        try:
            out["kv_bytes_per_token"] = kv_bytes_per_token(facts)
        except (KeyError, TypeError, ValueError) as exc:
            out["model"] = None
            out["source"] = f"model facts incomplete ({type(exc).__name__}: {exc})"
    return out


def bucket_roofline(hw: Optional[Mapping[str, Any]], ctx_sum_per_step: float,
                    attn_mean_ms: Optional[float]) -> dict[str, Any]:
    """``ctx_sum_per_step`` must be the mean over the same steps as ``attn_mean_ms``.  Per-bucket view: ``{"available": True, "pct": ..., ...}`` or ``{"available": False, "reason": ...}``."""
    if not hw:
        return {"available": False, "reason": "no device/model facts reported"}
    if hw.get("unavailable"):
        return {"available": False, "reason": str(hw["unavailable"])}
    gbps = hw.get("hbm_gbps")
    per_tok = hw.get("kv_bytes_per_token")
    if not gbps:
        return {"available": False, "reason": hw.get("source") or "bandwidth unknown"}
    if not per_tok:
        return {"available": False, "reason": hw.get("source") or "model KV layout unknown"}
    if not attn_mean_ms or attn_mean_ms <= 0:
        return {"available": False, "reason": "no verify attention time in this bucket"}
    if not ctx_sum_per_step or ctx_sum_per_step <= 0:
        return {"available": False, "reason": "no context summed over the steps with an attention time"}
    nbytes = per_tok * ctx_sum_per_step
    return {"available": True, "pct": percent_of_roofline(nbytes, attn_mean_ms, gbps),
            "kv_bytes_per_step": nbytes, "achieved_gbps": nbytes / (attn_mean_ms / 1e3) / 1e9,
            "hbm_gbps": gbps}
