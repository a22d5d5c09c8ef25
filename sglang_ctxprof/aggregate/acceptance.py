"""Acceptance by draft position, and the execution-mode fingerprint, as exact integer counts.

Per context bucket, keyed by each *request's own* context (not the batch mean), acceptance is kept as
counts of ``(budget, correct)`` pairs: one per request-step, where ``correct`` is the number of draft
tokens accepted (SGLang's accepted length minus the bonus token; for tree drafts the accepted depth)
and ``budget`` the step's draft budget in positions (``StepRecord.draft_depth``).  From them:

* ``hist[n]``: request-steps with exactly ``n`` correct drafts;
* ``p[i-1]`` = P(position i accepted) = #(correct >= i) / #(budget >= i), i = 1..k: a step whose
  budget was below ``i`` (adaptive speculation) is unobserved at ``i``, never a rejection;
* ``c[i-1]`` = p_i / p_{i-1} (p_0 = 1): the conditional rate;
* ``mean_len`` = 1 + mean correct drafts (the bonus token included: SGLang's accept length for a
  drafter whose steps carry one non-draft token; UNO's carry two, the bonus and its clean root, so
  SGLang's accept length there is this plus 1, as ``accepted_per_step`` says);
* ``observed[i-1]`` / ``accepted[i-1]``: the exact counts behind ``p[i-1]`` (what the Prometheus
  counters ``..._position_observed_total`` / ``..._position_accepted_total`` add up to).

:func:`count_record` is the one reading of a record's acceptance: the aggregator and the live
metrics both count with it (through the aggregator's :class:`CountsMemo`, which the live metrics
share), so every view gives the same ``p_i``.

The execution fingerprint counts steps per mode ("graph" | "eager" | "piecewise" | "unknown"), the
attention backends seen and the reasons SGLang gave for not running a graph.  A **downgrade** is an
eager or piecewise step whose reason is not "CUDA graphs disabled": graphs were on and verify ran
without them.  Pure: counts merge across ranks by addition.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from itertools import repeat
from typing import Any, Mapping, MutableMapping, Optional, Sequence

from ..model.names import EXEC_EAGER, EXEC_GRAPH, EXEC_MODES, EXEC_PIECEWISE, EXEC_REASON_DISABLED, EXEC_UNKNOWN
from ..model.records import StepRecord, accepted_drafts

MAX_REASONS = 8  # distinct reasons kept per bucket (the rest are counted under "other")


def key(budget: int, correct: int) -> str:
    return f"{budget}:{correct}"


def add(counts: MutableMapping[str, int], budget: int, correct: int, n: int = 1) -> None:
    """Count ``n`` request-steps.  A budget below what was accepted is raised to it (never negative)."""
    correct = max(0, int(correct))
    budget = max(int(budget), correct)
    k = key(budget, correct)
    counts[k] = counts.get(k, 0) + n


MEMO = 64  # records whose counts a CountsMemo remembers (by identity) for the next reader of the same record


class CountsMemo:
    """:func:`count_record`, remembered for the record's next reader: the aggregator that owns this
    memo reads a record first, the live metrics (handed the same memo) the same record on the drain
    thread a little later, so the grouping over a large batch's requests runs once.  A slot holds one
    (record, edges, counts) by the record's identity (one list store: safe across threads; a
    collision only costs a recount).  The counts are shared between readers: read them, never
    change them."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: list[Optional[tuple[StepRecord, Sequence[int], dict[tuple[int, int, int], int]]]] = [None] * MEMO

    def __call__(self, rec: StepRecord, edges: Sequence[int]) -> dict[tuple[int, int, int], int]:
        slot = (id(rec) >> 4) % MEMO
        hit = self._slots[slot]
        if hit is not None and hit[0] is rec and (hit[1] is edges or hit[1] == edges):
            return hit[2]
        out = count_record(rec, edges)
        self._slots[slot] = (rec, edges, out)
        return out


def count_record(rec: StepRecord, edges: Sequence[int]) -> dict[tuple[int, int, int], int]:
    """The one reading of a decode record's acceptance, used by the aggregator and the live metrics:
    ``{(own context bucket index, budget, correct drafts): request-steps}``.  ``correct`` is the
    accepted length minus the record's ``non_draft_tokens`` (the bonus token; UNO's clean root too);
    ``budget`` is the step's draft budget (``draft_depth``, else the chain behind the anchor), raised
    to ``correct`` where it is below.  Requests whose accepted length is unknown (0) and records of
    plain decode (algorithm ``NONE``) count nothing."""
    if rec.algorithm == "NONE" or not rec.accepted:
        return {}
    budget = rec.draft_depth or rec.draft_positions
    nd = rec.non_draft_tokens
    if len(rec.accepted) == 1:  # batch 1: the one request's pair, without the grouping below
        a = rec.accepted[0]
        if a <= 0:
            return {}
        correct = accepted_drafts(a, nd)
        return {(max(0, bisect_right(edges, rec.ctx_lens[0]) - 1), max(budget, correct), correct): 1}
    # One C-level pass groups the requests by (own context bucket, accepted); Python then runs once
    # per distinct pair, not once per request (bucket i is bisect_right(edges, ctx) - 1).  A batch
    # whose shortest and longest context share a bucket (the common case) is grouped by accepted
    # alone: a third of the work.
    ctx = rec.ctx_lens
    lo = bisect_right(edges, min(ctx))
    if lo == bisect_right(edges, max(ctx)):
        pairs: Mapping[tuple[int, int], int] = {(lo, a): n for a, n in Counter(rec.accepted).items()}
    else:
        pairs = Counter(zip(map(bisect_right, repeat(edges), ctx), rec.accepted))
    out: dict[tuple[int, int, int], int] = {}
    for (i1, a), n in pairs.items():
        if a <= 0:  # unknown (never read from the device)
            continue
        correct = accepted_drafts(a, nd)
        k = (max(0, i1 - 1), max(budget, correct), correct)
        out[k] = out.get(k, 0) + n
    return out


def merge_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + int(v)
    return out


def _pairs(counts: Mapping[str, int]) -> list[tuple[int, int, int]]:
    out = []
    for k, v in counts.items():
        b, n = k.split(":")
        out.append((int(b), int(n), int(v)))
    return out


def view(counts: Mapping[str, int]) -> dict[str, Any] | None:
    """The ``acceptance_by_position`` dict of one bucket, or None without request-steps."""
    pairs = _pairs(counts)
    total = sum(v for _, _, v in pairs)
    if not total:
        return None
    k = max(max(b for b, _, _ in pairs), max(n for _, n, _ in pairs))
    hist = [0] * (k + 1)
    for _, n, v in pairs:
        hist[n] += v
    p, c, observed, accepted = [], [], [], []
    prev = 1.0
    for i in range(1, k + 1):
        obs = sum(v for b, _, v in pairs if b >= i)
        hit = sum(v for b, n, v in pairs if b >= i and n >= i)
        pi = hit / obs if obs else 0.0
        p.append(pi)
        c.append(pi / prev if prev > 0 else 0.0)
        observed.append(obs)
        accepted.append(hit)
        prev = pi
    mean_len = 1.0 + sum(n * v for _, n, v in pairs) / total
    return {"n_steps": total, "hist": hist, "p": p, "c": c, "mean_len": mean_len, "observed": observed,
            "accepted": accepted}


# ---- execution mode ----------------------------------------------------------------------------------
def new_exec() -> dict[str, Any]:
    return {**{m: 0 for m in EXEC_MODES}, "backends": {}, "reasons": {}}


def add_exec(e: MutableMapping[str, Any], mode: str, backend: str, reason: str) -> None:
    m = mode if mode in EXEC_MODES else EXEC_UNKNOWN
    e[m] = e.get(m, 0) + 1
    if backend:
        e["backends"][backend] = e["backends"].get(backend, 0) + 1
    if reason:
        reasons = e["reasons"]
        if reason not in reasons and len(reasons) >= MAX_REASONS:
            reason = "other"
        reasons[reason] = reasons.get(reason, 0) + 1


def merge_exec(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    if not a and not b:
        return {}
    out = new_exec()
    for src in (a, b):
        for m in EXEC_MODES:
            out[m] += int(src.get(m, 0))
        for part in ("backends", "reasons"):
            for k, v in (src.get(part) or {}).items():
                out[part][k] = out[part].get(k, 0) + int(v)
    return out


def exec_view(e: Mapping[str, Any]) -> dict[str, Any]:
    """The ``exec_mode`` dict of one bucket: counts, backend, downgrade flag, share and reason."""
    counts = {m: int(e.get(m, 0)) for m in EXEC_MODES}
    total = sum(counts.values())
    reasons = dict(e.get("reasons") or {})
    down = sum(v for r, v in reasons.items() if r != EXEC_REASON_DISABLED)
    down = min(down, counts[EXEC_EAGER] + counts[EXEC_PIECEWISE])
    backends = e.get("backends") or {}
    backend = ", ".join(sorted(backends, key=lambda b: -backends[b]))
    if down:
        reason = max((r for r in reasons if r != EXEC_REASON_DISABLED), key=lambda r: reasons[r])
    elif counts[EXEC_EAGER] and not counts[EXEC_GRAPH] and EXEC_REASON_DISABLED in reasons:
        reason = EXEC_REASON_DISABLED
    else:
        reason = ""
    return {**counts, "attn_backend": backend, "downgrade": bool(down),
            "downgrade_share": down / total if total else 0.0, "reason": reason,
            "reasons": reasons}


def describe_exec(x: Mapping[str, Any]) -> str:
    """One phrase: "graph", "eager (CUDA graphs disabled)", "eager in 12% of steps (reason)"..."""
    total = sum(int(x.get(m, 0)) for m in EXEC_MODES)
    if not total:
        return "unknown"
    if x.get("downgrade"):
        return (f"downgrade: verify ran without its CUDA graph in {100 * x['downgrade_share']:.0f}% "
                f"of steps ({x['reason']})")
    main = max(EXEC_MODES, key=lambda m: int(x.get(m, 0)))
    if main == EXEC_EAGER and x.get("reason"):
        return f"eager ({x['reason']})"
    return main if int(x.get(main, 0)) == total else f"mostly {main}"

