"""The live self-audit (``aggregate.audit``) as the views show it, summed over ranks.

Each rank's ``/ctx_profile/status`` carries its audit (``audit``: ``violations`` per invariant,
``checked``, ``latest``); here they are added up for the ``?format=prometheus`` exposition
(``sglang_ctxprof_invariant_violations_total{invariant}``, the family the live metrics export) and
turned into the diagnosis flag ``invariant_violations``: the numbers in this profile disagree with
the engine's books or with themselves, so read them with care.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..model.names import AUDIT_INVARIANTS, LABEL_INVARIANT, METRIC_INVARIANT_VIOLATIONS


def audit_counts(ranks: Iterable[Mapping[str, Any]], since: str = "violations") -> dict[str, int]:
    """Violations per invariant over the ranks that answered (every invariant, 0 included); {} when
    no rank reported an audit.  ``since``: "violations" since the profile's last reset (the
    diagnosis), "lifetime" since the server started (the counter; a rank that reports none gives
    its ``violations``)."""
    out: dict[str, int] = {}
    for r in ranks:
        audit = ((r or {}).get("status") or {}).get("audit") if isinstance(r, Mapping) else None
        if not isinstance(audit, Mapping):
            continue
        counts = audit.get(since) or audit.get("violations") or {}
        for inv in AUDIT_INVARIANTS:
            out[inv] = out.get(inv, 0) + int(counts.get(inv, 0) or 0)
    return out


def audit_flags(counts: Mapping[str, int]) -> list[dict[str, str]]:
    """The diagnosis flag for broken invariants (none when every count is 0)."""
    bad = {k: v for k, v in counts.items() if v}
    if not bad:
        return []
    what = ", ".join(f"{k} x{v}" for k, v in bad.items())
    return [{"kind": "invariant_violations", "message": f"the self-audit found broken invariants ({what}): "
             "the profile disagrees with SGLang's own counts or with itself; see /ctx_profile/status (audit)"}]


def prometheus_lines(ranks: Iterable[Mapping[str, Any]]) -> list[str]:
    """The counter's exposition: the lifetime counts, which a reset leaves as they are."""
    counts = audit_counts(ranks, since="lifetime")
    if not counts:
        return []
    m = f"{METRIC_INVARIANT_VIOLATIONS}_total"
    out = [f"# HELP {m} Broken invariants found by the live self-audit.", f"# TYPE {m} counter"]
    return out + [f'{m}{{{LABEL_INVARIANT}="{k}"}} {v}' for k, v in counts.items()]
