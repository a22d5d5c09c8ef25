"""On a real CPU server: ``sglang-ctxprof sweep`` / ``report`` against tiny DeepSeek-V3 + EAGLE.

One module-scoped server.  A 3-point sweep with ``--repeat 2`` (short 4 / long 40 new tokens) and a
small sustained run; checks exact prompt lengths, the files (JSON per point, CSV, PNG), the server's
breakdown per point, that ``--resume`` re-runs nothing finished, ``--ctx`` beyond the context length,
``report``, and, last (it kills the server), a sweep whose server dies mid-way.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, make_server_fixture, tiny
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

CTX = (64, 1024, 3072)
SMALL = ["--repeat", "2", "--short", "4", "--long", "40"]
PHASES = ("draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "step")


def _args():
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    return cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile"]


server = make_server_fixture("sweep-dsv3-eagle", _args)


@pytest.fixture(scope="module")
def run_dir(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "run"
    rc = main(["sweep", "--url", server.url, "--ctx", *map(str, CTX), "--out", str(out),
               "--sustained", "48", "--window", "16"] + SMALL)
    assert rc == 0
    return out


def _points(d):
    return {(p["ctx"], p["repeat"]): p for p in (json.loads(f.read_text()) for f in d.glob("point-*.json"))}


def test_prompt_tokens_exact_and_distinct_prompts(run_dir):
    pts = _points(run_dir)
    assert sorted(pts) == [(c, r) for c in CTX for r in range(2)]
    for (ctx, _), p in pts.items():
        assert p["prompt_tokens"] == ctx
        assert p["short"]["prompt_tokens"] == p["long"]["prompt_tokens"] == ctx
        assert p["short"]["completion_tokens"] == 4 and p["long"]["completion_tokens"] == 40
        assert p["cached_tokens"] <= 1  # distinct prompts: the radix cache could not skip the prefill
        assert p["prompt_mode"] == "corpus"


def test_files_csv_and_png(run_dir):
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["has_profile"] is True and meta["ctx"] == list(CTX) and "distinct prompts" in meta["cache_policy"]
    setup = meta["server_setup"]  # SGLang's own /server_info: what a resume and each point are checked against
    assert setup["speculative_algorithm"] == "EAGLE" and setup["attention_backend"] == "intel_amx", setup
    assert setup["version"] and setup["tp_size"] == 1
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    assert [int(r["ctx"]) for r in rows] == list(CTX)
    assert all(r["prompt_tokens"] == r["ctx"] for r in rows)
    summ = json.loads((run_dir / "summary.json").read_text())
    assert len(summ["rows"]) == 3
    import matplotlib.image as mpimg

    for name in ("decode_tok_s.png", "phase_ms.png", "accept.png"):
        img = mpimg.imread(run_dir / name)
        assert img.shape[0] > 100 and img.shape[1] > 100


def test_breakdown_per_point_present_and_positive(run_dir):
    for p in _points(run_dir).values():
        b = p["breakdown"]
        assert b is not None and b["steps"] >= 2, p
        for ph in PHASES:
            assert b["phases_ms"][ph] > 0, (p["ctx"], ph)
        assert b["accepted_per_step"] > 1.5  # identity EAGLE head
        assert b["server_tok_s"] > 0
        # the point's profile holds exactly this point's two requests
        reqs = p["server_requests"]
        assert reqs["long"]["steps"] == p["long"]["spec_verify_ct"]
        assert reqs["short"]["prompt_tokens"] == p["ctx"]
    for r in csv.DictReader(open(run_dir / "summary.csv")):
        for ph in PHASES:
            assert float(r[f"ms_{ph}"]) > 0


def test_sustained_windows_and_breakdown(run_dir):
    for ctx in CTX:
        s = json.loads((run_dir / f"sustained-c{ctx:06d}.json").read_text())
        assert s["prompt_tokens"] == ctx and s["completion_tokens"] == 48
        assert s["decode_tok_s"] > 0 and len(s["windows"]) >= 2
        assert s["windows"][0]["ctx_start"] >= ctx and s["windows"][-1]["ctx_end"] <= ctx + 48
        assert s["breakdown"]["phases_ms"]["verify_attn"] > 0
        assert s["tok_s_source"] == "client stream" and s["decode_tok_s"] == s["client_decode_tok_s"]
        assert s["server_decode_tok_s"] > 0 and s["server_windows"]  # the server's figure, beside it


def test_resume_does_not_rerun_finished_points(server, run_dir, capsys):
    victim = run_dir / "point-c001024-r01.json"
    victim.unlink()
    before = {f.name: f.read_text() for f in run_dir.glob("*-c*.json")}
    capsys.readouterr()
    rc = main(["sweep", "--url", server.url, "--ctx", *map(str, CTX), "--out", str(run_dir), "--resume",
               "--sustained", "48", "--window", "16"] + SMALL)
    assert rc == 0
    assert "8 result(s) already" in capsys.readouterr().err
    after = {f.name: f.read_text() for f in run_dir.glob("*-c*.json")}
    assert set(after) == set(before) | {victim.name}
    assert all(after[k] == v for k, v in before.items())  # finished points untouched
    assert json.loads(after[victim.name])["prompt_tokens"] == 1024


def test_report_from_files(run_dir, capsys):
    for f in run_dir.glob("*.png"):
        f.unlink()
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "3072" in out and "v.attn" in out and "sustained" in out
    assert (run_dir / "phase_ms.png").exists()


def test_ctx_beyond_context_length(server, tmp_path, capsys):
    assert main(["sweep", "--url", server.url, "--ctx", "64", "8190", "--out", str(tmp_path / "r")] + SMALL) == 2
    err = capsys.readouterr().err
    assert "exceeds the server's context length" in err and "Traceback" not in err
    assert not list((tmp_path / "r").glob("point-*"))


def test_server_killed_mid_sweep(server, tmp_path):
    """Last test of the module: it kills the server."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "sglang_ctxprof.cli.main", "sweep", "--url", server.url,
           "--ctx", "64", "1024", "3072", "--repeat", "3", "--short", "4", "--long", "40", "--out", str(out),
           "--timeout", "60"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not list(out.glob("point-*.json")) and time.time() - t0 < 300 and proc.poll() is None:
            time.sleep(0.2)
        assert list(out.glob("point-*.json")), "no point finished"
        os.killpg(os.getpgid(server.proc.pid), signal.SIGKILL)  # killed, not a graceful shutdown
        _, err = proc.communicate(timeout=120)
        server.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    line = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(line) == 1 and "kept" in line[0] and "--resume" in line[0], err
    kept = list(out.glob("point-*.json"))
    assert kept and all(json.loads(f.read_text())["prompt_tokens"] in (64, 1024, 3072) for f in kept)
