"""``sglang-ctxprof report DIR``: the sweep table and PNG plots again, from the saved files alone.

Reads ``DIR``'s ``point-*.json`` / ``sustained-*.json`` (no server needed), prints the same rich
table as the sweep, rewrites ``summary.csv``/``summary.json``/``table.txt`` and writes the plots
(``decode_tok_s.png``, ``phase_ms.png``, ``accept.png``) into ``DIR`` or ``--plots-dir``.  A
``sweep --arms`` directory (``DIR/spec`` and ``DIR/plain``) gets the arms table, the crossover and the
speculation ledger instead.
"""

from __future__ import annotations

from pathlib import Path

from . import sweep_results as res
from .main import printable


def add_cli_args(ap) -> None:
    ap.add_argument("dir", help="a sweep --out directory")
    ap.add_argument("--plots-dir", default=None, help="where to write the PNGs and summary files (default: DIR)")
    ap.add_argument("--no-plots", dest="plots", action="store_false", help="table only")
    ap.add_argument("--json", action="store_true", help="print the per-context summary as JSON")


def run(ns) -> int:
    import json

    if (Path(ns.dir) / "spec").is_dir() and (Path(ns.dir) / "plain").is_dir():  # a sweep --arms directory
        from .sweep_arms import arms_report, render_arms

        rep = arms_report(Path(ns.dir))
        print(json.dumps(rep, indent=1) if ns.json else "\n".join(render_arms(rep)))
        return 0

    meta, points, sust = res.load_run(ns.dir)
    rows = res.summarize(points, sust)
    if ns.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return 0
    console = res.screen_console()
    console.print(f"run {_shown(ns.dir)}", highlight=False, markup=False, soft_wrap=True)  # a path may be any length
    console.print(f"model {printable(meta.get('model_path', '?'))}, {len(points)} two-point result(s), "
                  f"{len(sust)} sustained", highlight=False, markup=False)
    res.render_table(rows, meta, console)
    out = Path(ns.plots_dir or ns.dir)
    out.mkdir(parents=True, exist_ok=True)
    res.write_summary(out, meta, rows)
    if ns.plots:
        from .plots import model_title, write_plots

        paths = write_plots(rows, out, title=model_title(meta.get("model_path")))
        console.print("plots: " + ", ".join(paths), highlight=False, markup=False)
    return 0


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies under it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
