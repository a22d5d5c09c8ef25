"""The sweep table: what ``sweep``/``report``/``demo`` print fits a 120-column terminal, and the full
table (every column) goes to the results directory as ``table.txt``."""

from __future__ import annotations

import copy
from pathlib import Path

from sglang_ctxprof.cli import sweep_results as res
from sglang_ctxprof.cli.main import main

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sweep"
FULL_ONLY = ("prompt_tok", "t_a s", "t_b s", "srv tok/s", "sust srv tok/s", "sust acc/step")


def _with_sustained(rows: list[dict]) -> list[dict]:
    """The demo's rows carry a sustained run per context; the recorded fixtures do not: add one."""
    rows = copy.deepcopy(rows)
    for r in rows:
        r["sustained"] = {"tokens": 256, "decode_tok_s": 123.4, "server_decode_tok_s": 125.6,
                          "accept_per_step": 3.82, "server_accept_per_step": 3.82, "step_ms": 30.1,
                          "windows": []}
        r["phases_ms"]["unattributed"] = {"median": 0.12, "min": 0.1, "max": 0.2, "spread": 0.05, "n": 3,
                                          "second": 0.12}
    return rows


def test_report_prints_lines_of_at_most_120_columns_and_writes_the_full_table(tmp_path, capsys):
    assert main(["report", str(FIX / "longer"), "--plots-dir", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "5120" in out and "v.attn" in out
    wide = [ln for ln in out.splitlines() if len(ln) > 120]
    assert not wide, f"{len(wide)} line(s) wider than 120 columns, e.g. {len(wide[0])}: {wide[0]!r}"
    full = (tmp_path / "table.txt").read_text()
    for h in FULL_ONLY[:4]:
        assert h in full, h
    assert "5120" in full and "v.attn ms" in full


def test_every_column_of_a_demo_like_run_fits_or_goes_to_the_file(tmp_path):
    from rich.console import Console

    meta, points, _ = res.load_run(FIX / "longer")
    rows = _with_sustained(res.summarize(points))
    con = Console(width=200, record=True, file=open(tmp_path / "screen.txt", "w"))
    res.render_table(rows, meta, con)
    screen = con.export_text()
    assert max(len(ln) for ln in screen.splitlines()) <= 120
    for h in ("ctx", "tok/s", "acc/step", "step", "draft", "v.attn", "v.moe", "d.ext",
              "unattr", "sust tok/s"):
        assert h in screen, h
    res.write_summary(tmp_path, meta, rows)
    full = (tmp_path / "table.txt").read_text()
    for h in FULL_ONLY:
        assert h in full, h
    assert "123.4" in full and "125.6" in full


def test_a_prompt_of_the_wrong_length_is_still_flagged_on_screen(tmp_path):
    from rich.console import Console

    meta, points, _ = res.load_run(FIX / "baseline")
    rows = res.summarize(points)
    rows[0]["prompt_tokens"] = [63]
    con = Console(width=200, record=True, file=open(tmp_path / "screen.txt", "w"))
    res.render_table(rows, meta, con)
    screen = con.export_text()
    assert "64 (!)" in screen and "prompt" in screen
