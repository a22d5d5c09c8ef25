"""``sglang-ctxprof compare A B``: did run B get slower than baseline A, and is it a regression?

Per context length and per quantity (each leaf phase's ms per decode step, the step, accepted tokens
per step, two-point decode tok/s), B is compared with what A predicts:

* at a context A measured too: A's own value;
* at a context only B measured: A's per-phase least-squares fit over context (ms per 1k ctx), so a
  longer-context run is judged against the baseline's own context scaling.

The noise model and the verdict (regression / inherent context scaling / no significant change /
nothing comparable; exit code 1 on a regression, for CI, and 2 when nothing could be compared) are
:mod:`sglang_ctxprof.model.noise`'s, shared with ``diagnose --baseline``.  A result file that this
version cannot read is one ``error:`` line naming it (``sweep_results.load_run``), exit 2.
"""

from __future__ import annotations

import json

from ..model.noise import PHASES, compare, fit  # noqa: F401 - the noise model, shared with diagnose
from . import sweep_results as res


def add_cli_args(ap) -> None:
    ap.add_argument("baseline", help="sweep directory A (the baseline)")
    ap.add_argument("candidate", help="sweep directory B (the run to judge)")
    ap.add_argument("--k", type=float, default=2.0, help="noise multiplier on the repeats' spread")
    ap.add_argument("--rel", type=float, default=0.05, help="relative noise floor (fraction of A)")
    ap.add_argument("--abs-ms", type=float, default=0.05, help="absolute noise floor for ms values")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run(ns) -> int:
    _, pa, sa = res.load_run(ns.baseline)
    _, pb, sb = res.load_run(ns.candidate)
    rows_a, rows_b = res.summarize(pa, sa), res.summarize(pb, sb)
    out = compare(rows_a, rows_b, ns.k, ns.rel, ns.abs_ms)
    if ns.json:
        print(json.dumps(out, indent=1))
        return out["exit_code"]
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    t = Table(title=f"compare  A={escape(str(ns.baseline))}  B={escape(str(ns.candidate))}")  # names, not markup
    for h in ("ctx", "quantity", "A", "B", "Δ", "Δ%", "noise ±", "A from", "status"):
        t.add_column(h, justify="right")
    for c in sorted(out["checks"], key=lambda c: c["ctx"]):
        style = {"worse": "bold red", "better": "green"}.get(c["status"], "dim" if "(" in c["status"] else None)
        pct = "-" if c["delta_pct"] is None else f"{c['delta_pct']:+.1f}"
        t.add_row(str(c["ctx"]), res.SHORT.get(c["quantity"], c["quantity"]), f"{c['a']:.3f}", f"{c['b']:.3f}",
                  f"{c['delta']:+.3f}", pct, f"{c['noise']:.3f}", c["source"], c["status"], style=style)
    console.print(t)
    console.print("A, B: best of the repeats for ms per step (median for acceptance and tok/s); "
                  "(status) = shown, not judged", highlight=False, markup=False)
    console.print(f"verdict: {out['verdict']}: {out['why']}", highlight=False, markup=False)
    return out["exit_code"]
