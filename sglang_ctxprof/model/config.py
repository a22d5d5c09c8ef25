"""Configuration, read once from the environment when profiling starts.

Environment variables (all optional):

``SGLANG_CTX_PROFILE=1``
    Turn profiling on (same as ``--enable-ctx-profile``).
``SGLANG_CTXPROF_BUCKETS`` (default ``pow2``)
    Context buckets: ``pow2``, ``fixed:<width>`` or ``edges:<a>,<b>,...``.
``SGLANG_CTXPROF_MAX_CTX`` (default 1048576)
    Largest context the bucket layout covers (later contexts share an open-ended bucket).
``SGLANG_CTXPROF_QUEUE_SIZE`` (default 8192, ~16 MB of records at batch 32)
    Bound of the hand-off queue between hooks and aggregator; overflow is counted as drops.
``SGLANG_CTXPROF_REQUEST_RING`` (default 4096)
    How many recent requests keep totals and step-by-step rows.
``SGLANG_CTXPROF_STEP_RING`` (default 256)
    How many recent raw decode steps are kept.
``SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY`` (default 64)
    Under CUDA graphs, read the in-graph attention/MoE events on every K-th step (the scheduler
    processes that step's result before launching the next batch; see ``graph_timing``).
``SGLANG_CTXPROF_GRAPH_FALLBACK`` (default ``off``)
    Without ``Event(external=True)``: ``off`` reports the split unavailable under graphs,
    ``eager`` runs sampled verify steps without their graph and times the blocks with plain events.
``SGLANG_CTXPROF_HBM_GBPS``
    Memory bandwidth (GB/s) for the verify-attention roofline, overriding the GPU table.
``SGLANG_CTXPROF_FAULT`` (test only)
    Name of one component (``hooks``, ``recorder``, ``aggregator``, ``http``) that raises on purpose,
    to prove fault isolation.  Never set it in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

from . import names
from .buckets import DEFAULT_MAX_CTX, Bucketing


def _int(env: Mapping[str, str], key: str, default: int, lo: int = 1) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not an integer") from None
    if v < lo:
        raise ValueError(f"{key}={raw!r} must be >= {lo}")
    return v


def env_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(names.ENV_ENABLE, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class CtxProfConfig:
    buckets: str = "pow2"
    max_ctx: int = DEFAULT_MAX_CTX
    queue_size: int = 8192
    request_ring: int = 4096
    step_ring: int = 256
    fault: str = ""
    graph_sample_every: int = 64
    graph_fallback: str = "off"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "CtxProfConfig":
        env = os.environ if env is None else env
        cfg = cls(
            buckets=env.get(names.ENV_BUCKETS, "pow2") or "pow2",
            max_ctx=_int(env, names.ENV_MAX_CTX, DEFAULT_MAX_CTX),
            queue_size=_int(env, names.ENV_QUEUE_SIZE, 8192),
            request_ring=_int(env, names.ENV_REQUEST_RING, 4096),
            step_ring=_int(env, names.ENV_STEP_RING, 256, lo=0),
            fault=env.get(names.ENV_FAULT, ""),
            graph_sample_every=_int(env, names.ENV_GRAPH_SAMPLE_EVERY, 64),
            graph_fallback=env.get(names.ENV_GRAPH_FALLBACK, "off") or "off",
        )
        if cfg.graph_fallback not in ("off", "eager"):
            raise ValueError(f"{names.ENV_GRAPH_FALLBACK}={cfg.graph_fallback!r} must be 'off' or 'eager'")
        cfg = replace(cfg, **overrides) if overrides else cfg
        cfg.bucketing()  # validate early: a bad spec is a clear error at start-up
        return cfg

    def bucketing(self) -> Bucketing:
        return Bucketing.parse(self.buckets, self.max_ctx)
