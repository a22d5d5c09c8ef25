"""``sglang-ctxprof demo`` (what ``make demo`` runs) end to end on a real CPU server, at small sizes.

The demo is the README's main command: it builds the tiny model, sweeps with ``--launch``, and then
prints the server's own ``/ctx_profile`` table.  Run as a user would (the console script, a fresh
output folder), it must exit 0, print both tables, and leave the sweep's files behind.
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


def test_demo_runs_end_to_end_and_prints_the_servers_table(tmp_path):
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("sglang-ctxprof")
    out = tmp_path / "sweep"
    cmd = [str(exe), "demo", "--ctx", "64", "512", "--repeat", "1", "--long", "48", "--sustained", "32",
           "--models", str(MODEL_CACHE), "--out", str(out), "--log", str(LOG_DIR / "demo-server.log")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "decode by context length" in text
    # the sweep table fits a 120-column terminal even where the terminal is wider; every column is in table.txt
    table = text.split("decode by context length", 1)[1].split("results:", 1)[0].splitlines()
    assert table and max(len(ln) for ln in table) <= 120, table
    assert "prompt_tok" not in "\n".join(table) and "prompt_tok" in (out / "table.txt").read_text()
    own = text.split("GET /ctx_profile?format=text", 1)
    assert len(own) == 2, text[-2000:]
    assert "64-127" in own[1] and "512-1023" in own[1], own[1]
    assert "server stopped" in text + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary, summary
    assert not any("Traceback" in s for s in (proc.stdout, proc.stderr))
