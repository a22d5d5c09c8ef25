"""``sglang-ctxprof demo`` (what ``make demo`` runs) end to end on real CPU servers, at small sizes.

The demo is the README's main command: it builds the tiny model and runs ``sweep --launch --arms
spec,plain``: two servers, the same model with speculation and without, started side by side, the
same prompts interleaved.  Run as a user would (the console script, a fresh output folder), it must
exit 0, print the speculative arm's phase table (fitting 120 columns), the speedup per context, the
ledger, and the servers' own diagnosis with the plain server as its baseline, and leave both arms'
files behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOG_DIR, MODEL_CACHE, ROOT

pytestmark = pytest.mark.server


def test_demo_runs_both_arms_end_to_end_and_prints_the_ledger(tmp_path):
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("sglang-ctxprof")
    out = tmp_path / "sweep"
    cmd = [str(exe), "demo", "--ctx", "64", "512", "--repeat", "1", "--long", "48",
           "--models", str(MODEL_CACHE), "--out", str(out), "--log", str(LOG_DIR / "demo-server.log")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "the speculative arm" in text and "decode by context length" in text, text[-3000:]
    # the spec arm's table fits a 120-column terminal even where the terminal is wider
    table = text.split("decode by context length", 1)[1].split("speculative vs plain decode", 1)[0].splitlines()
    assert table and max(len(ln) for ln in table) <= 120, table
    assert "speculation ledger" in text and "crossover" in text
    own = text.split("The servers' own view", 1)
    assert len(own) == 2, text[-2000:]
    assert "DIAGNOSIS (spec server)" in own[1] and "measured" in own[1], own[1]
    assert "64-127" in own[1] and "512-1023" in own[1], own[1]
    assert "servers stopped" in proc.stderr
    arms = json.loads((out / "arms.json").read_text())
    rows = arms["ledger"]["rows"]  # by sweep context; each sits where its steps ran, a little past the prompt
    assert [r["label"] for r in rows] == ["64", "512"] and 64 < rows[0]["ctx"] < 64 + 48, arms["ledger"]
    for arm in ("spec", "plain"):
        assert json.loads((out / arm / "summary.json").read_text())["rows"], arm
    assert not any("Traceback" in s for s in (proc.stdout, proc.stderr))
