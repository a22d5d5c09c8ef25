"""Which finished requests are "slow", and which ones are exported as traces (tail-based sampling).

The decision is taken when a request *finishes*, from its whole history, so a ``slow`` policy exports
exactly the slow requests, each with all its steps (head-based sampling could not know).

Environment (read once at start-up; ``POST /ctx_profile/trace_policy`` changes it at run time):

``SGLANG_CTXPROF_TRACE`` (default ``off``)
    ``off``: no spans; ``slow``: export the requests this policy calls slow; ``all``: every request.
``SGLANG_CTXPROF_SLOW_TOK_S`` (default ``20``)
    A request is slow if its decode speed (committed tokens / summed decode step time) is below this
    many tokens per second.  ``0`` disables this criterion.
``SGLANG_CTXPROF_SLOW_STEP_MS`` (default ``250``)
    A request is slow if one of its decode steps took longer than this; a step this long is also a
    ``slow_step`` log event.  ``0`` disables this criterion.

A request with no decode step (it finished at prefill) is never slow by the tok/s criterion.
Pure: imports only the standard library and the package vocabulary.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from ..model import names

MODES = ("off", "slow", "all")
DEFAULT_SLOW_TOK_S = 20.0
DEFAULT_SLOW_STEP_MS = 250.0


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"{key}={raw!r} must be a finite number >= 0")
    return v


def _mode(raw: Any, key: str = names.ENV_TRACE) -> str:
    m = str(raw or "off").strip().lower()
    if m not in MODES:
        raise ValueError(f"{key}={raw!r}: use one of {', '.join(MODES)}")
    return m


@dataclass(frozen=True)
class TracePolicy:
    mode: str = "off"
    slow_tok_s: float = DEFAULT_SLOW_TOK_S
    slow_step_ms: float = DEFAULT_SLOW_STEP_MS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TracePolicy":
        env = os.environ if env is None else env
        return cls(mode=_mode(env.get(names.ENV_TRACE)),
                   slow_tok_s=_float(env, names.ENV_TRACE_SLOW_TOK_S, DEFAULT_SLOW_TOK_S),
                   slow_step_ms=_float(env, names.ENV_TRACE_SLOW_STEP_MS, DEFAULT_SLOW_STEP_MS))

    def updated(self, changes: Mapping[str, Any]) -> "TracePolicy":
        """A copy with ``changes`` applied (keys: mode, slow_tok_s, slow_step_ms); bad input raises."""
        unknown = set(changes) - {"mode", "slow_tok_s", "slow_step_ms"}
        if unknown:
            raise ValueError(f"unknown trace policy field(s): {', '.join(sorted(unknown))}")
        kw: dict[str, Any] = {}
        if "mode" in changes:
            kw["mode"] = _mode(changes["mode"], "mode")
        for k in ("slow_tok_s", "slow_step_ms"):
            if k in changes:
                kw[k] = _float({k: str(changes[k])}, k, 0.0)
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ---- decisions ------------------------------------------------------------------------------
    def step_is_slow(self, step_ms: float) -> bool:
        return self.slow_step_ms > 0 and step_ms > self.slow_step_ms

    def slow_reason(self, summary: Mapping[str, Any]) -> str:
        """Why a finished request (a ``request_log`` summary with ``step_rows``) is slow, or ""."""
        reasons = []
        steps = int(summary.get("steps") or 0)
        tok_s = float(summary.get("decode_tok_s") or 0.0)
        if self.slow_tok_s > 0 and steps > 0 and tok_s < self.slow_tok_s:
            reasons.append(f"decode_tok_s {tok_s:.1f} < {self.slow_tok_s:g}")
        if self.slow_step_ms > 0:
            worst = max((float(r.get("step_ms", 0.0)) for r in summary.get("step_rows") or ()), default=0.0)
            if worst > self.slow_step_ms:
                reasons.append(f"step {worst:.1f} ms > {self.slow_step_ms:g} ms")
        return "; ".join(reasons)

    def should_export(self, summary: Mapping[str, Any]) -> tuple[bool, str]:
        """Tail-based decision for one finished request: (export?, slow reason or "")."""
        reason = self.slow_reason(summary)  # also reported with mode off (slow_request log event)
        if self.mode == "off":
            return False, reason
        if self.mode == "all":
            return True, reason
        return bool(reason), reason
