"""bench/gpu_check.py's CPU self-test: the prepared GPU script runs its three checks on the simulated
device through the same code paths (hooks, Profiler, CudaEventClock, GraphTimer) and passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_passes(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, OUT="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--steps", "12",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("graph_vs_eager", "overhead", "no_sync"):
        assert f"PASS {name}" in proc.stdout
    res = json.loads(out.read_text())
    assert res["pass"] is True and res["dry_run"] is True
    gve = res["checks"]["graph_vs_eager"]
    assert gve["split_mode"] == "cuda_graph_events"
    # the simulated device charges 2 µs per event node: the start node's cost falls inside each block
    assert gve["verify_attn"]["graph_ms"] == pytest.approx(gve["verify_attn"]["eager_ms"] + 4 * 0.002)
    assert res["checks"]["no_sync"]["extra_sync_calls"] == 0
    ov = res["checks"]["overhead"]
    assert ov["events_in_graph"] == 2 * 2 * 4  # begin/end x (attn, MoE) x 4 layers
    assert ov["replay_ms_plain_graph"] == ov["replay_ms_no_profiler"]  # unsampled replays pay nothing
    assert ov["us_per_event_node"] == pytest.approx(2.0)  # what the timed copy costs, per node


def test_gpu_check_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--steps", "1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--steps >= 4" in proc.stderr and "Traceback" not in proc.stderr
