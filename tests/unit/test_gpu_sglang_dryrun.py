"""The GPU SGLang runner (bench/gpu_sglang) on its canned server: every stage's logic, its checks and its
JSON, with no GPU, no SGLang and no network (the real run is one command on the GPU machine)."""

from __future__ import annotations

import math

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GS = ROOT / "bench" / "gpu_sglang"


@pytest.fixture()
def runner(monkeypatch):
    monkeypatch.syspath_prepend(str(GS))
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import dry_server
    import runner as r

    monkeypatch.setattr(dry_server, "BREAK", set())
    yield r, dry_server


def test_dry_run_writes_every_stage(runner, tmp_path, monkeypatch):
    r, _ = runner
    monkeypatch.setenv("SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY", "8")
    rc = r.main([str(tmp_path / "out"), "--dry", "--pairs", "2", "--skip", "probe", "--work", str(tmp_path / "w")])
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rc == 0, res["summary"]
    assert res["summary"] == {k: "ok" for k in ("imports", "server_graph", "decode", "diagnosis", "ab", "eager", "drain")}
    st = res["stages"]
    assert st["server_graph"]["timed_copies"]["shapes"] == 6
    assert [b["label"] for b in st["decode"]["buckets"]["buckets"]] == ["64-128", "1024-2048", "4096-8192"]
    assert all(q["ok"] for q in st["decode"]["requests"]["requests"]) and len(st["decode"]["requests"]["requests"]) == 7
    labels = st["decode"]["timing_labels"]["labels"]
    assert labels["cuda_graph_events"] > 0 and labels["cuda_graph"] > labels["cuda_graph_events"]
    for conc in ("1", "16"):
        ab = st["ab"]["concurrency"][conc]
        assert len(ab["pair_ratios"]) == 2 and ab["ci95"][0] <= ab["median"] <= ab["ci95"][1]
    gap = st["eager"]["gap"]["1024-2048"]
    assert gap["attn_ratio_graph_over_eager"] == pytest.approx(1.0)
    assert gap["moe_ratio_graph_over_eager"] == pytest.approx(0.5 / 0.55)
    assert (tmp_path / "out" / "server_logs.txt").exists()
    for key in ("rows", "gpu_rows"):  # bench/drain_gil.py ran for real (on this machine's CPU): every busy mode
        drain = st["drain"][key]
        assert [r["mode"] for r in drain] == ["whole", "paced", "process", "inline"] and all(r["batch"] == 1 for r in drain)
        assert all(r["gil_p99_floor_pct"] >= 0 for r in drain)  # idle against idle: what the machine resolves
        assert all(r["drain_us_per_record"] > 0 for r in drain)  # each mode's drain (or hand-off) did the work
        for r in drain:  # the tail's steps that held a drain-thread collection: some of those counted
            hit, top = r["p99_steps_in_drain_gc"]
            assert 0 <= hit <= top and math.isfinite(r["gil_p99_no_drain_gc_pct"])


@pytest.mark.parametrize("broken, check", [("leaves", "buckets"), ("reconcile", "requests"),
                                           ("labels", "timing_labels")])
def test_each_check_can_fail(runner, broken, check):
    r, dry = runner
    dry.BREAK = {broken}
    srv = dry.DryServer(r.server_args("/m", graphs=True))
    cl = srv.start()
    try:
        outs = r.decode_run(cl, contexts=(64, 1024), new=16, together=2)
        st, body = cl.get("/ctx_profile")
        got = {"buckets": r.bucket_checks(body)["ok"], "requests": r.request_checks(cl, outs)["ok"],
               "timing_labels": r.timing_labels(cl, 8)["ok"]}
    finally:
        srv.stop()
    assert got == {k: k != check for k in got}


def test_a_missing_phase_fails(runner):
    r, _ = runner
    body = {"leaf_phases": ["draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend"],
            "buckets": [{"label": "64-128", "steps": 3, "phases": {
                "draft": {"mean_ms": 1, "total_ms": 3}, "verify_attn": {"mean_ms": 1, "total_ms": 3},
                "verify_moe": {"mean_ms": 0, "total_ms": 0}, "verify_rest": {"mean_ms": 1, "total_ms": 3},
                "draft_extend": {"mean_ms": 1, "total_ms": 3}, "step": {"mean_ms": 4, "total_ms": 12}}}]}
    out = r.bucket_checks(body)
    assert not out["ok"] and out["buckets"][0]["missing"] == ["verify_moe"]
    assert out["buckets"][0]["leaves_tile_step"]


def test_stage_time_limit_and_skip(runner, tmp_path):
    r, _ = runner
    run = r.Run(tmp_path, budget_s=1e9, dry=True)

    def slow_then_late():
        part = run.partial  # taken at the stage's start, as the runner's stages do
        part["first half"] = {"ok": True}  # what a stage finished before its limit
        __import__("time").sleep(1.0)
        part["late"] = True  # the thread left behind writes after its stage timed out
        return {"ok": True}

    res = run.stage("slow", slow_then_late, need_s=0, limit_s=0.3)
    assert res["ok"] is False and "timed out" in res["error"] and res["partial"] == {"first half": {"ok": True}}
    nxt = run.stage("next", lambda: __import__("time").sleep(1.5) or {"ok": True}, need_s=0, limit_s=5)
    assert nxt["ok"] and "late" not in run.partial  # the next stage's dict is its own
    run.budget_s = 0
    assert run.stage("late", lambda: {"ok": True}, need_s=10, limit_s=5) is None
    saved = json.loads((tmp_path / "results.json").read_text())["stages"]
    assert "skipped" in saved["late"] and saved["slow"]["ok"] is False


def test_build_strip_lists_match_the_readme():
    text = (GS / "README.md").read_text()
    sys.path.insert(0, str(GS))
    import build

    for d in build.KERNEL_DROP + build.SGLANG_DROP:
        assert d.rstrip("/").split("/")[-1] in text, d


def test_sigterm_stops_the_servers_and_keeps_their_logs(tmp_path):
    """``timeout`` or the device tool's limit sends SIGTERM: the servers' ``finally`` still runs."""
    import os
    import signal
    import subprocess
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(GS / "runner.py"), str(out), "--dry", "--skip", "imports,probe,drain",
                             "--work", str(tmp_path / "w")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "CTXPROF_DRY_START_S": "60"})
    seen = []
    for line in proc.stdout:  # the server's start-up is under way, inside the stage: stop the run there
        seen.append(line)
        if "dry-server: starting slowly" in line:
            break
    proc.send_signal(signal.SIGTERM)
    text = "".join(seen) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert (out / "server_logs.txt").exists() and "stopped: exit 143" in text
    assert "stage eager" not in text  # no later stage ran
    res = json.loads((out / "results.json").read_text())
    assert res["stages"]["server_graph"] == {"ok": False, "error": "stopped by a signal while it ran"}


def test_a_probe_kit_past_its_time_keeps_the_probes_it_finished(runner, tmp_path, monkeypatch):
    """The probe stage runs last, on what time is left: a kit killed there still leaves probes.json."""
    r, _ = runner
    real = r.subprocess.run

    def short(cmd, *a, **kw):
        if any("gpu_probe.py" in str(c) for c in cmd):
            kw["timeout"] = 0.7  # the dry kit takes ~2 s: some probes finish, not all
        return real(cmd, *a, **kw)

    monkeypatch.setattr(r.subprocess, "run", short)
    r.main([str(tmp_path / "out"), "--dry", "--work", str(tmp_path / "w"),
            "--skip", "imports,server_graph,eager,drain"])
    stage = json.loads((tmp_path / "out" / "results.json").read_text())["stages"]["probe"]
    assert stage["ok"] is False and stage["rc"] == "timeout"
    merged = json.loads((tmp_path / "out" / "probes.json").read_text())
    assert sorted(merged) == stage["probes"]
