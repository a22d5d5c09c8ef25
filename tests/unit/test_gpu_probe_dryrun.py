"""The GPU probe kit's CPU self-test: ``bench/gpu_probe.py --dry-run`` runs every probe (P0-P10), each
in its own process, on the simulated device, and ``DRY=1 bench/gpu_run.sh`` (the one prepared GPU
command) runs the probes and both ``gpu_check`` runs.  What the probes find on the simulated device
is what ``testing/fake_cuda`` models; the GPU run replaces those answers with the device's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ("P0", "P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10")


def _load(d, name):
    res = json.loads((d / f"{name}.json").read_text())
    assert res["ok"] and res["dry_run"], res
    return res["result"]


def test_every_probe_runs_on_the_simulated_device(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_probe.py"), str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and list(summary["probes"]) == [p for p in PROBES if p != "P6"] + ["P6"]  # P6 last
    r = {p: _load(tmp_path, p) for p in PROBES}
    assert r["P0"]["external_event_factory"]["ok"] and r["P0"]["external_record_in_capture_times"]["value"] > 0
    assert r["P1"]["after_replay_and_sync"]["elapsed_time"]["value"] == pytest.approx(1.002)
    assert r["P2"]["latest_replay_wins"]
    assert r["P3"]["query_false_without_raising"]
    assert "raises" in r["P4"]["after_replay"]["query"]  # a plain event in capture is no timer
    assert r["P5"]["side_pair_ms"]["value"] == pytest.approx(2.002)
    # the fake follows the H200's P6: no error, and the events that took the freed handles change
    assert r["P6"]["replay_after_delete"] == {"value": None} and r["P6"]["fresh_events_changed"]
    assert r["P7"]["separate"]
    assert r["P8"]["us_per_node"]["512"] == pytest.approx(2.0)  # the fake charges 2 µs per node
    assert r["P9"]["read_ok"] and r["P9"]["events"] == 240
    assert r["P10"]["as_expected"], r["P10"]
    assert r["P10"]["k4_gate"]["sampled_reads"] == 10 and r["P10"]["k1_no_gate"]["overwritten"] > 0


def test_only_and_unknown_probe(tmp_path):
    ok = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_probe.py"), str(tmp_path), "--dry-run",
                         "--only", "P3"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["P3.json", "summary.json"]
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_probe.py"), str(tmp_path), "--only", "P11"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "unknown probes" in bad.stderr and "Traceback" not in bad.stderr


def test_the_prepared_gpu_command_runs_dry(tmp_path):
    env = dict(os.environ, DRY="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_run.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    back = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert back == ["gpu_check.json", "gpu_check_layers60.json", "probes.json", "run.log"]  # 8 come back at most
    merged = json.loads((tmp_path / "probes.json").read_text())
    assert {f"P{i}" for i in range(11)} | {"summary"} <= set(merged)
    deep = json.loads((tmp_path / "gpu_check_layers60.json").read_text())
    assert deep["pass"] and deep["checks"]["overhead"]["events_in_graph"] == 2 * 2 * 60
    assert deep["checks"]["graph_vs_eager"]["report_only"]  # launch-bound eager blocks: reported, no bar
