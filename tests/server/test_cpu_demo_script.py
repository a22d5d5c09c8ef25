"""launch/cpu-demo.sh really serves: the tiny DeepSeek-V3 + EAGLE-3 on the CPU with the profiler on."""

from __future__ import annotations

import pytest

from conftest import LOG_DIR, ROOT, generate, http, rand_ids
from sglang_ctxprof.cli.server import ServerProcess, free_port

pytestmark = pytest.mark.server


def test_cpu_demo_script_serves_a_profile():
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    import sys

    srv = ServerProcess([], port=port, env={"PORT": str(port), "PYTHON": sys.executable},
                        log_path=str(LOG_DIR / "launch-cpu-demo.log"), timeout=600)
    srv.cmd = ["bash", str(ROOT / "launch" / "cpu-demo.sh")]  # the script execs sglang.launch_server
    srv.start()
    try:
        out = generate(srv.url, rand_ids(300, seed=3), max_new_tokens=16)
        assert out["meta_info"]["spec_verify_ct"] > 0
        status, body = http("GET", srv.url + "/ctx_profile")
        assert status == 200 and body["algorithms"] == ["EAGLE3"]
        (b,) = body["buckets"]
        assert b["label"] == "256-511"
        for p in ("draft", "verify", "verify_attn", "verify_moe", "draft_extend"):
            assert b["phases"][p]["mean_ms"] > 0, p
        status, text = http("GET", srv.url + "/metrics")  # --enable-metrics from launch/_common.sh
        assert status == 200 and "sglang:" in text
    finally:
        srv.stop()
