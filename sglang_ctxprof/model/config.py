"""The one configuration: every ``SGLANG_CTXPROF_*`` variable is parsed here, and only here.

:meth:`CtxProfConfig.from_env` reads the environment once into a frozen object with nested parts
(``trace``, ``logs``, ``export``, ``graph``, ``roofline``, ``capture``); explicit keyword overrides beat the
environment.  The plugin calls it in SGLang's main process before any scheduler is spawned, so a
bad value of any variable is one clear error line there (and profiling stays off), never a
surprise later in a scheduler.  The schedulers parse the same environment again, and the views
receive values from the parts instead of reading the environment.

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
``SGLANG_CTXPROF_TRACE`` (default ``off``) - ``trace``
    ``off``: no spans; ``slow``: export the requests the policy calls slow; ``all``: every request.
``SGLANG_CTXPROF_SLOW_TOK_S`` (default 20) - ``trace``
    A request is slow below this decode speed (tokens/s); ``0`` disables the criterion.
``SGLANG_CTXPROF_SLOW_STEP_MS`` (default 250) - ``trace``
    A request is slow if one decode step took longer (also a ``slow_step`` event); ``0`` disables.
``SGLANG_CTXPROF_OTEL_QUEUE`` (default 8192; else ``OTEL_BSP_MAX_QUEUE_SIZE``) - ``export``
    Spans queued for the OTLP exporter; beyond it spans are dropped and counted.
``SGLANG_CTXPROF_LOG`` (default ``text``) - ``logs``
    structlog events: ``off``, ``text`` or ``json``.
``SGLANG_CTXPROF_LOG_FILE`` (default ``stderr``) - ``logs``
    A path, ``stderr`` or ``stdout``.
``SGLANG_CTXPROF_LOG_LEVEL`` (default ``info``) - ``logs``
    ``debug``, ``info`` or ``warning``.
``SGLANG_CTXPROF_LOG_SUMMARY_S`` (default 60) - ``logs``
    Seconds between ``ctx_profile_summary`` events (``0``: none).
``SGLANG_CTXPROF_LOG_SLOW_STEPS_PER_MIN`` (default 6) - ``logs``
    At most this many ``slow_step`` events a minute.
``SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY`` (default 64) - ``graph``
    Under CUDA graphs, read the in-graph attention/MoE events on every K-th step.
``SGLANG_CTXPROF_GRAPH_FALLBACK`` (default ``off``) - ``graph``
    Without ``Event(external=True)``: ``off`` reports the split unavailable under graphs,
    ``eager`` runs sampled verify steps without their graph and times the blocks with plain events.
``SGLANG_CTXPROF_GRAPH_TIMED_SHAPES`` (default ``all``) - ``graph``
    Which target-verify graphs get a timed copy (each costs a second capture and its own graph
    memory): ``all``, ``none``, ``every:N`` (every N-th captured shape, in capture order), or a
    comma list of batch sizes.
``SGLANG_CTXPROF_HBM_GBPS`` - ``roofline``
    Memory bandwidth (GB/s) for the verify-attention roofline, overriding the GPU table.
``SGLANG_CTXPROF_CAPTURE_DIR`` (default ``<tmp>/sglang-ctxprof-captures``) - ``capture``
    Where deep captures (SGLang's own profiler traces) are written.
``SGLANG_CTXPROF_CAPTURE_INTERVAL_S`` (default 900) - ``capture``
    At most one capture per interval; triggers inside it are suppressed and counted.
``SGLANG_CTXPROF_CAPTURE_MAX_STEPS`` (default 32) - ``capture``
    The most steps one capture covers (``?steps=N`` above it is refused).
``SGLANG_CTXPROF_CAPTURE_STEPS`` (default 4) - ``capture``
    Steps an automatic (or a ``POST`` without ``steps``) capture covers.
``SGLANG_CTXPROF_CAPTURE_MAX_MB`` (default 256) - ``capture``
    Byte cap on the kept captures; the oldest are deleted first.
``SGLANG_CTXPROF_CAPTURE_SLOW_FACTOR`` (default 0: off) - ``capture``
    Trigger a capture when a decode step takes more than this factor times its context bucket's
    prediction (the bucket's p50 step time, once it holds 16 steps) ...
``SGLANG_CTXPROF_CAPTURE_SLOW_RUN`` (default 1) - ``capture``
    ... for this many decode steps in a row.
``SGLANG_CTXPROF_CAPTURE_HOST_GAP_MS`` (default 0: off) - ``capture``
    Trigger a capture when the host gap between two steps exceeds this many ms.
``SGLANG_CTXPROF_CAPTURE_SLOW_REQUEST`` (default 0: off) - ``capture``
    ``1``: capture the next steps of a running request the trace policy already judges slow
    (``SGLANG_CTXPROF_SLOW_TOK_S``, ``SGLANG_CTXPROF_SLOW_STEP_MS``, as changed at run time).
``SGLANG_CTXPROF_READ_SHARE`` (default 0.1)
    The most of SGLang's HTTP process the read routes' builds may take (0 < share <= 1): a read
    soon after another waits (asynchronously) for a cool-down in proportion (``views.http_gate``).
    The build thread shares the GIL with the event loop that streams every response, so this is
    also about the most a loop of reads can delay a streamed chunk.
``SGLANG_CTXPROF_CONTROL_TIMEOUT_S`` (default 30)
    How long a route waits for every scheduler to answer its control command (a scheduler answers
    between two steps); past it the route answers 504, and until that late answer comes every
    route answers 504 at once (``control.client``).
``SGLANG_CTXPROF_FAULT`` (test only)
    A component to break on purpose (``hooks``, ``recorder``, ``aggregator``, ``exporter``,
    ``control``, ``http``, ...), or ``runtime`` for the test-only fault switch.  Never in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from . import names
from .buckets import DEFAULT_MAX_CTX, Bucketing
from .guard import COMPONENTS, FAULT_RUNTIME

TRACE_MODES = ("off", "slow", "all")
LOG_FORMATS = ("off", "text", "json")
LOG_LEVELS = ("debug", "info", "warning")
GRAPH_FALLBACKS = ("off", "eager")
DEFAULT_OTEL_QUEUE = 8192


def _raw(env: Mapping[str, str], key: str) -> Optional[str]:
    raw = env.get(key)
    return None if raw is None or str(raw).strip() == "" else str(raw).strip()


def parse_int(key: str, raw: Any, lo: int = 1) -> int:
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={raw!r} is not an integer") from None
    if v < lo:
        raise ValueError(f"{key}={raw!r} must be >= {lo}")
    return v


def parse_float(key: str, raw: Any, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 with ``positive``; -0 is 0); bad input (a boolean too) raises
    ValueError naming ``key``."""
    if isinstance(raw, bool):
        raise ValueError(f"{key}={raw!r} is not a number")
    try:
        v = float(raw) + 0.0
    except (TypeError, ValueError):
        raise ValueError(f"{key}={repr(raw)[:40]} is not a number") from None
    except OverflowError:
        raise ValueError(f"{key}={repr(raw)[:40]}... must be a finite number >= 0") from None
    if positive and not v > 0:
        raise ValueError(f"{key}={raw!r} must be > 0")
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"{key}={raw!r} must be a finite number >= 0")
    return v


def parse_timed_shapes(key: str, raw: Any) -> str:
    """``all`` | ``none`` | ``every:N`` (N >= 1) | a comma list of batch sizes, normalized."""
    text = str(raw).strip().lower().replace(" ", "")
    if text in ("all", "none"):
        return text
    if text.startswith("every:"):
        return f"every:{parse_int(key, text[6:])}"
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise ValueError(f"{key}={raw!r}: expected all, none, every:N or batch sizes like 1,8,32")
    return ",".join(map(str, sizes))


def parse_choice(key: str, raw: Any, choices: tuple[str, ...]) -> str:
    v = str(raw).strip().lower()
    if v not in choices:
        raise ValueError(f"{key}={raw!r}: use one of {', '.join(choices)}")
    return v


def _int(env: Mapping[str, str], key: str, default: int, lo: int = 1) -> int:
    raw = _raw(env, key)
    return default if raw is None else parse_int(key, raw, lo)


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = _raw(env, key)
    return default if raw is None else parse_float(key, raw)


def _choice(env: Mapping[str, str], key: str, default: str, choices: tuple[str, ...]) -> str:
    raw = _raw(env, key)
    return default if raw is None else parse_choice(key, raw, choices)


SUMMARY_S = (0.1, 86400.0)  # the log summary's period: 0 (off) or within these seconds
FAULTS = ("", FAULT_RUNTIME) + COMPONENTS  # SGLANG_CTXPROF_FAULT: none, the runtime switch, or a component


def _summary_s(env: Mapping[str, str]) -> float:
    v = _float(env, names.ENV_LOG_SUMMARY_S, 60.0)
    if v and not SUMMARY_S[0] <= v <= SUMMARY_S[1]:
        raise ValueError(f"{names.ENV_LOG_SUMMARY_S}={_raw(env, names.ENV_LOG_SUMMARY_S)!r}: use 0 (off) or "
                         f"{SUMMARY_S[0]:g} to {SUMMARY_S[1]:g} seconds")
    return v


def _fault(env: Mapping[str, str]) -> str:
    v = (env.get(names.ENV_FAULT, "") or "").strip()
    if v not in FAULTS:
        raise ValueError(f"{names.ENV_FAULT}={v!r}: use one of {', '.join(f or repr(f) for f in FAULTS)}")
    return v


def _log_dest(env: Mapping[str, str]) -> str:
    """``stderr``, ``stdout`` (any case) or a file whose folder exists."""
    raw = _raw(env, names.ENV_LOG_FILE) or "stderr"
    if raw.strip().lower() in ("stderr", "stdout"):
        return raw.strip().lower()
    folder = os.path.dirname(os.path.abspath(raw))
    if not os.path.isdir(folder):
        raise ValueError(f"{names.ENV_LOG_FILE}={raw!r}: its folder {folder!r} does not exist")
    return raw


def _hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    """Host names, comma-separated: a name as a browser's Host header gives it (no scheme, no path)."""
    out = tuple(h.strip().lower() for h in (_raw(env, names.ENV_ALLOWED_HOSTS) or "").split(",") if h.strip())
    bad = [h for h in out if "/" in h or ":" in h or " " in h]
    if bad:
        raise ValueError(f"{names.ENV_ALLOWED_HOSTS}: {bad[0]!r} is no host name (give names only, e.g. "
                         f"profiler.example.com, without a scheme, port or path)")
    return out


READ_SHARE = 0.1  # the default share of SGLang's HTTP process the read builds may take
CONTROL_TIMEOUT_S = 30.0  # the default wait for every scheduler's answer to a control command


def _share(env: Mapping[str, str]) -> float:
    raw = _raw(env, names.ENV_READ_SHARE)
    v = READ_SHARE if raw is None else parse_float(names.ENV_READ_SHARE, raw, positive=True)
    if v > 1:
        raise ValueError(f"{names.ENV_READ_SHARE}={raw!r} must be at most 1 (a share of the time)")
    return v


def env_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(names.ENV_ENABLE, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class TraceSettings:
    """Tail-based sampling of finished requests (the initial ``views.policy.TracePolicy``)."""
    mode: str = "off"
    slow_tok_s: float = 20.0
    slow_step_ms: float = 250.0


@dataclass(frozen=True)
class LogSettings:
    """structlog events (``views.logs``)."""
    fmt: str = "text"
    dest: str = "stderr"
    level: str = "info"
    summary_s: float = 60.0
    slow_steps_per_min: int = 6


@dataclass(frozen=True)
class ExportSettings:
    """The OTLP span exporter (the standard ``OTEL_*`` variables choose its endpoint and protocol)."""
    otel_queue: int = DEFAULT_OTEL_QUEUE


@dataclass(frozen=True)
class GraphSettings:
    """The verify attention/MoE split under CUDA graphs (``collect.graph_clock``)."""
    sample_every: int = 64
    fallback: str = "off"
    timed_shapes: str = "all"


@dataclass(frozen=True)
class RooflineSettings:
    """The verify-attention roofline: ``hbm_gbps`` overrides the GPU table (None: use the table)."""
    hbm_gbps: Optional[float] = None


@dataclass(frozen=True)
class CaptureSettings:
    """Deep capture through SGLang's own profiler (``collect.capture``): budget and triggers.
    ``slow_factor``, ``host_gap_ms`` and ``slow_request`` are the automatic triggers, each off by default."""
    dir: str = ""
    interval_s: float = 900.0
    max_steps: int = 32
    steps: int = 4
    max_mb: float = 256.0
    slow_factor: float = 0.0
    slow_run: int = 1
    host_gap_ms: float = 0.0
    slow_request: bool = False

    @property
    def auto(self) -> bool:
        return self.slow_factor > 0 or self.host_gap_ms > 0 or self.slow_request


def _capture(env: Mapping[str, str]) -> CaptureSettings:
    import tempfile

    max_steps = _int(env, names.ENV_CAPTURE_MAX_STEPS, 32)
    steps = _int(env, names.ENV_CAPTURE_STEPS, min(4, max_steps))
    if steps > max_steps:
        raise ValueError(f"{names.ENV_CAPTURE_STEPS}={steps} is above "
                         f"{names.ENV_CAPTURE_MAX_STEPS}={max_steps}")
    slow = _float(env, names.ENV_CAPTURE_SLOW_FACTOR, 0.0)
    if 0 < slow <= 1:
        raise ValueError(f"{names.ENV_CAPTURE_SLOW_FACTOR}={slow} must be 0 (off) or above 1")
    return CaptureSettings(
        dir=_raw(env, names.ENV_CAPTURE_DIR) or os.path.join(tempfile.gettempdir(), "sglang-ctxprof-captures"),
        interval_s=_float(env, names.ENV_CAPTURE_INTERVAL_S, 900.0),
        max_steps=max_steps, steps=steps,
        max_mb=parse_float(names.ENV_CAPTURE_MAX_MB, _raw(env, names.ENV_CAPTURE_MAX_MB) or 256, positive=True),
        slow_factor=slow, slow_run=_int(env, names.ENV_CAPTURE_SLOW_RUN, 1),
        host_gap_ms=_float(env, names.ENV_CAPTURE_HOST_GAP_MS, 0.0),
        slow_request=_choice(env, names.ENV_CAPTURE_SLOW_REQUEST, "0", ("0", "1")) == "1")


@dataclass(frozen=True)
class CtxProfConfig:
    buckets: str = "pow2"
    max_ctx: int = DEFAULT_MAX_CTX
    queue_size: int = 8192
    request_ring: int = 4096
    read_share: float = READ_SHARE
    control_timeout_s: float = CONTROL_TIMEOUT_S
    fault: str = ""
    allowed_hosts: tuple[str, ...] = ()  # names besides addresses and this machine's a write may use
    trace: TraceSettings = field(default_factory=TraceSettings)
    logs: LogSettings = field(default_factory=LogSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    graph: GraphSettings = field(default_factory=GraphSettings)
    roofline: RooflineSettings = field(default_factory=RooflineSettings)
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    clock: str = names.CLOCK_WALL  # a CPU server's phase clock (names.CLOCKS); CUDA uses its events

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "CtxProfConfig":
        """Parse every variable (bad values raise ValueError naming the variable)."""
        env = os.environ if env is None else env
        for key, why in names.ENV_REMOVED.items():
            if _raw(env, key) is not None:
                raise ValueError(f"{key} is no longer used: {why}; unset it")
        otel_queue = _raw(env, names.ENV_OTEL_QUEUE)
        key = names.ENV_OTEL_QUEUE
        if otel_queue is None and _raw(env, "OTEL_BSP_MAX_QUEUE_SIZE") is not None:
            otel_queue, key = _raw(env, "OTEL_BSP_MAX_QUEUE_SIZE"), "OTEL_BSP_MAX_QUEUE_SIZE"
        hbm = _raw(env, names.ENV_HBM_GBPS)
        cfg = cls(
            buckets=_raw(env, names.ENV_BUCKETS) or "pow2",
            max_ctx=_int(env, names.ENV_MAX_CTX, DEFAULT_MAX_CTX),
            queue_size=_int(env, names.ENV_QUEUE_SIZE, 8192),
            request_ring=_int(env, names.ENV_REQUEST_RING, 4096),
            read_share=_share(env),
            control_timeout_s=parse_float(names.ENV_CONTROL_TIMEOUT_S,
                                          _raw(env, names.ENV_CONTROL_TIMEOUT_S) or CONTROL_TIMEOUT_S,
                                          positive=True),
            fault=_fault(env),
            allowed_hosts=_hosts(env),
            trace=TraceSettings(
                mode=_choice(env, names.ENV_TRACE, "off", TRACE_MODES),
                slow_tok_s=_float(env, names.ENV_TRACE_SLOW_TOK_S, 20.0),
                slow_step_ms=_float(env, names.ENV_TRACE_SLOW_STEP_MS, 250.0)),
            logs=LogSettings(
                fmt=_choice(env, names.ENV_LOG, "text", LOG_FORMATS),
                dest=_log_dest(env),
                level=_choice(env, names.ENV_LOG_LEVEL, "info", LOG_LEVELS),
                summary_s=_summary_s(env),
                slow_steps_per_min=_int(env, names.ENV_LOG_SLOW_STEP_PER_MIN, 6, lo=0)),
            export=ExportSettings(
                otel_queue=DEFAULT_OTEL_QUEUE if otel_queue is None else parse_int(key, otel_queue)),
            graph=GraphSettings(
                sample_every=_int(env, names.ENV_GRAPH_SAMPLE_EVERY, 64),
                fallback=_choice(env, names.ENV_GRAPH_FALLBACK, "off", GRAPH_FALLBACKS),
                timed_shapes=parse_timed_shapes(names.ENV_GRAPH_TIMED_SHAPES,
                                                _raw(env, names.ENV_GRAPH_TIMED_SHAPES) or "all")),
            roofline=RooflineSettings(
                hbm_gbps=None if hbm is None else parse_float(names.ENV_HBM_GBPS, hbm, positive=True)),
            capture=_capture(env),
            clock=_choice(env, names.ENV_CLOCK, names.CLOCK_WALL, names.CLOCKS),
        )
        cfg = replace(cfg, **overrides) if overrides else cfg
        try:
            cfg.bucketing()  # validate early: a bad spec is a clear error at start-up
        except ValueError as exc:
            raise ValueError(f"{names.ENV_BUCKETS}={cfg.buckets!r}: {exc}") from None
        return cfg

    def bucketing(self) -> Bucketing:
        return Bucketing.parse(self.buckets, self.max_ctx)
