"""``sweep --launch --draft-tokens 2 4 8``: one sweep per draft budget, and the budget advice measured.

Each budget N gets its own server (``--speculative-num-draft-tokens N``; with top-k 1 also
``--speculative-num-steps N-1``, a chain of N-1 drafts) and its own result directory ``OUT/dt-N``.
The closing table gives, per context, the two-point decode tok/s (client clock, median over
repeats) and the server's tok/s for every budget, and the best budget: what the diagnosis's
draft-budget advice otherwise has to assume.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import sweep_results as res

if TYPE_CHECKING:
    from .sweep import SweepArgs

_DT, _STEPS, _TOPK, _ALG = ("--speculative-num-draft-tokens", "--speculative-num-steps",
                            "--speculative-eagle-topk", "--speculative-algorithm")


def _value(sargs: list[str], flag: str) -> str | None:
    return sargs[sargs.index(flag) + 1] if flag in sargs and sargs.index(flag) + 1 < len(sargs) else None


def _split(sargs: list[str]) -> list[str]:
    """The arguments with each ``--speculative-...=value`` as a flag and its value."""
    out: list[str] = []
    for a in sargs:
        out += a.split("=", 1) if a.startswith("--speculative-") and "=" in a else [a]
    return out


def with_budget(sargs: list[str], n: int) -> list[str]:
    """The server arguments with draft budget ``n`` (existing budget flags replaced, in either the
    ``--flag value`` or the ``--flag=value`` form)."""
    sargs = _split(sargs)
    chain = int(_value(sargs, _TOPK) or 1) <= 1 and (_value(sargs, _ALG) or "").upper() != "NGRAM"
    drop = {_DT} | ({_STEPS} if chain else set())
    out, skip = [], False
    for a in sargs:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        out.append(a)
    out += [_DT, str(n)] + ([_STEPS, str(n - 1)] if chain else [])
    return out


def budget_table(per_budget: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per context: tok/s by budget (two-point client median, server) and the best budget, judged by
    the server's figure where every budget has one, else by the client's (``best_by``), never a mix."""
    ctxs = sorted({r["ctx"] for rows in per_budget.values() for r in rows})
    table = []
    for c in ctxs:
        cells = {}
        for n, rows in sorted(per_budget.items()):
            r = next((r for r in rows if r["ctx"] == c), None)
            if r is not None:
                cells[n] = {"tok_s": res._med(r["decode_tok_s"]), "server_tok_s": res._med(r["server_tok_s"]),
                            "accept_per_step": res._med(r["accept_per_step"])}
        by = "server" if cells and all(v["server_tok_s"] for v in cells.values()) else "client"  # one kind
        scored = {n: v["server_tok_s" if by == "server" else "tok_s"] for n, v in cells.items()}
        scored = {n: v for n, v in scored.items() if v}
        table.append({"ctx": c, "by_budget": cells, "best": max(scored, key=scored.get) if scored else None,
                      "best_by": by})
    return table


def run_budgets(args: "SweepArgs", run_args) -> int:
    rc = 0
    per: dict[int, list[dict[str, Any]]] = {}
    for n in args.draft_tokens:
        sub = replace(args, draft_tokens=[], out=str(Path(args.out) / f"dt-{n}"),
                      server_args=with_budget(list(args.server_args), n), launch_log=None)
        print(f"\n=== draft budget {n} ({' '.join(sub.server_args[-4:])}) ===", flush=True)
        rc = max(rc, run_args(sub))
        meta, points, sust = res.load_run(sub.out)
        per[n] = res.summarize(points, sust)
    table = budget_table(per)
    res.write_json(Path(args.out) / "budgets.json", {"draft_tokens": list(args.draft_tokens), "table": table})
    print("\ndecode tok/s by draft budget (two-point client / server), best budget per context:")
    for row in table:
        cells = "  ".join(f"N={n}: {res._f(v['tok_s'], '{:.1f}')}/{res._f(v['server_tok_s'], '{:.1f}')} "
                          f"(acc {res._f(v['accept_per_step'])})" for n, v in row["by_budget"].items())
        print(f"  ctx {row['ctx']:>6}: {cells}  -> best N={row['best']} (by the {row['best_by']}'s tok/s)")
    return rc
