"""PNG plots of a sweep summary (matplotlib, imported lazily, Agg backend, no display needed).

* ``decode_tok_s.png``: two-point decode tok/s vs context (median, min-max bars) and, when present,
  sustained tok/s (overall and per window as the context grows) - the two side by side;
* ``phase_ms.png``: stacked leaf-phase ms per decode step vs context (from the server breakdown);
* ``accept.png``: accepted tokens per step vs context (client meta_info and server profile);
* ``overview.png``: the first two side by side (``docs/sweep-example.png``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..model.records import leaf_columns
from .sweep_results import SHORT

PLOT_FILES = ("decode_tok_s.png", "phase_ms.png", "accept.png", "overview.png")  # what write_plots may write

COLORS = {"draft": "#4C72B0", "verify": "#D4A373", "verify_attn": "#DD8452", "verify_moe": "#55A868",
          "verify_rest": "#C44E52", "draft_extend": "#8172B3", "overhead": "#937860", "unattributed": "#BBBBBB",
          "decode": "#64B5CD", "decode_attn": "#E5AE38", "decode_moe": "#6D904F", "decode_rest": "#8B8B8B"}


def model_title(model_path: str | None) -> str:
    """A short plot title from a model path: its last two components (``tiny-dsv3/target``)."""
    parts = [p for p in str(model_path or "").replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]).replace("$", r"\$")  # text, not mathtext


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tok_s(ax, rows: list[dict]) -> None:
    tp = [(r["ctx"], r["decode_tok_s"]) for r in rows if r["decode_tok_s"]]
    if tp:
        med = [d["median"] for _, d in tp]
        err = [[d["median"] - d["min"] for _, d in tp], [d["max"] - d["median"] for _, d in tp]]
        ax.errorbar([c for c, _ in tp], med, yerr=err, marker="o", capsize=3, label="two-point (client, marginal)")
    srv = [(r["ctx"], r["server_tok_s"]) for r in rows if r["server_tok_s"]]
    if srv:
        ax.plot([c for c, _ in srv], [s["median"] for _, s in srv], marker="x", linestyle=":",
                label="server: tokens per step / step time")
    sus = [(r["ctx"], r["sustained"]) for r in rows if r["sustained"] and r["sustained"].get("decode_tok_s")]
    if sus:
        ax.plot([c for c, _ in sus], [s["decode_tok_s"] for _, s in sus], marker="s", linestyle="--",
                label="sustained (client clock)")
        for i, (_, s) in enumerate(sus):
            w = s.get("windows") or []
            if w:
                ax.plot([(x["ctx_start"] + x["ctx_end"]) / 2 for x in w], [x["tok_s"] for x in w],
                        color="gray", alpha=0.5, linewidth=1, label="sustained windows" if i == 0 else None)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode tok/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _phases(ax, rows: list[dict]) -> None:
    labels = [str(r["ctx"]) for r in rows]
    bottom = [0.0] * len(rows)
    leaves, present = leaf_columns(r["phases_ms"] for r in rows)  # a forward whole where its split is missing
    for p in present:
        vals = [r["phases_ms"][p]["median"] if p in lv else 0.0 for r, lv in zip(rows, leaves)]
        ax.bar(labels, vals, bottom=bottom, color=COLORS[p], label=SHORT[p])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, axis="y")


def _accept(ax, rows: list[dict]) -> None:
    acc = [(r["ctx"], r["accept_per_step"]) for r in rows if r["accept_per_step"]]
    ax.plot([c for c, _ in acc], [a["median"] for _, a in acc], marker="o", label="two-point (meta_info)")
    srv = [(r["ctx"], r["server_accept_per_step"]) for r in rows if r["server_accept_per_step"]]
    if srv:
        ax.plot([c for c, _ in srv], [a["median"] for _, a in srv], marker="x", linestyle=":",
                label="server profile")
    sa = [(r["ctx"], r["sustained"]["accept_per_step"]) for r in rows
          if r["sustained"] and r["sustained"].get("accept_per_step")]
    if sa:
        ax.plot([c for c, _ in sa], [a for _, a in sa], marker="s", linestyle="--", label="sustained")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accepted tokens per step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def write_plots(rows: list[dict], out_dir: str | os.PathLike, title: str = "") -> list[str]:
    """Write the PNGs for ``rows`` (``sweep_results.summarize``) into ``out_dir``; return their paths."""
    if not rows:
        return []
    plt = _plt()
    out = Path(out_dir)
    suffix = f" - {title}" if title else ""
    present = leaf_columns(r["phases_ms"] for r in rows)[1]
    paths = []

    def save(fig, name):
        fig.tight_layout()
        paths.append(str(out / name))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    _tok_s(ax, rows)
    ax.set_title("decode throughput vs context" + suffix)
    save(fig, PLOT_FILES[0])
    if present:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        _phases(ax, rows)
        ax.set_title("where a decode step's time goes" + suffix)
        save(fig, PLOT_FILES[1])
    if any(r["accept_per_step"] for r in rows):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        _accept(ax, rows)
        ax.set_title("speculative acceptance vs context" + suffix)
        save(fig, PLOT_FILES[2])
    if present:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
        _tok_s(a1, rows)
        a1.set_title("decode tok/s vs context")
        _phases(a2, rows)
        a2.set_title("ms per decode step, by phase (server)")
        if title:
            fig.suptitle(title, fontsize=10)
        save(fig, PLOT_FILES[3])
    return paths
