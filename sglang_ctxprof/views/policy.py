"""Which finished requests are "slow", and which ones are exported as traces (tail-based sampling).

The decision is taken when a request *finishes*, from its whole history, so a ``slow`` policy exports
exactly the slow requests, each with all its steps (head-based sampling could not know).

The initial policy comes from the configuration's ``trace`` part (``SGLANG_CTXPROF_TRACE``,
``SGLANG_CTXPROF_SLOW_TOK_S``, ``SGLANG_CTXPROF_SLOW_STEP_MS``: see ``model.config``);
``POST /ctx_profile/trace_policy`` changes it at run time.  A request is slow if its decode speed
(committed tokens / summed decode step time) is below ``slow_tok_s``, or if one of its decode steps
took longer than ``slow_step_ms``; ``0`` disables a criterion.  A request with no decode step (it
finished at prefill) is never slow by the tok/s criterion.  Pure: imports only ``model``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from ..model.config import TRACE_MODES, TraceSettings, parse_choice, parse_float

MODES = TRACE_MODES
_DEFAULT = TraceSettings()


@dataclass(frozen=True)
class TracePolicy:
    mode: str = _DEFAULT.mode
    slow_tok_s: float = _DEFAULT.slow_tok_s
    slow_step_ms: float = _DEFAULT.slow_step_ms

    @classmethod
    def from_settings(cls, t: TraceSettings) -> "TracePolicy":
        return cls(mode=t.mode, slow_tok_s=t.slow_tok_s, slow_step_ms=t.slow_step_ms)

    def updated(self, changes: Mapping[str, Any]) -> "TracePolicy":
        """A copy with ``changes`` applied (keys: mode, slow_tok_s, slow_step_ms); bad input raises."""
        unknown = set(changes) - {"mode", "slow_tok_s", "slow_step_ms"}
        if unknown:
            raise ValueError(f"unknown trace policy field(s): {', '.join(ascii(k)[:40] for k in sorted(unknown)[:8])}")
        kw: dict[str, Any] = {}
        if "mode" in changes:
            kw["mode"] = parse_choice("mode", changes["mode"], MODES)
        for k in ("slow_tok_s", "slow_step_ms"):
            if k in changes:
                kw[k] = parse_float(k, changes[k])
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
            worst = max_step_ms(summary)
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


def max_step_ms(summary: Mapping[str, Any]) -> float:
    """A request's slowest decode step: its ``max_step_ms`` total, else the max over its step rows."""
    worst = summary.get("max_step_ms")
    if worst is not None:
        return float(worst)
    return max((float(r.get("step_ms", 0.0)) for r in summary.get("step_rows") or ()), default=0.0)
