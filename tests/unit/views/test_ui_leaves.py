"""The live page stacks a step's phases as the server adds them up (``records.leaf_phases``): a plain
step's decode by its parts, a forward that ran whole in a CUDA graph whole, never a forward and its
parts together; and it reads acceptance by position by the requests' own context, as every other
view (``acceptance_by_ctx``).  Node runs the page's own functions; skipped without ``node`` (failed in
CI, ``CI=true``, which installs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from sglang_ctxprof.model.records import leaf_phases
from sglang_ctxprof.views import ui

NODE = shutil.which("node")
STEPS = [
    {"step": 6.5, "decode": 6.0, "decode_attn": 2.0, "decode_moe": 3.0, "decode_rest": 1.0, "overhead": 0.5},
    {"step": 12.5, "draft": 3.0, "verify": 8.0, "draft_extend": 1.0, "overhead": 0.5},
    {"step": 12.5, "draft": 3.0, "verify": 8.0, "verify_attn": 5.0, "verify_moe": 2.0, "verify_rest": 1.0,
     "draft_extend": 1.0, "overhead": 0.5, "unattributed": 0.0},
]


def _page_leaves(steps: list[dict]) -> list[list[str]]:
    js = ui.read("app.js").decode()
    start, end = js.index("  const LEAF_ORDER = "), js.index("  const COLORS = ")
    code = (js[start:end] + "\nconsole.log(JSON.stringify(JSON.parse(process.argv[1]).map((s) => leavesIn([s]))));")
    run = subprocess.run([NODE, "-e", code, json.dumps(steps)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def test_the_page_stacks_the_phases_the_server_adds_up():
    if NODE is None:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("needs node")
    assert _page_leaves(STEPS) == [list(leaf_phases(s)) for s in STEPS]
    assert [sum(s[p] for p in leaf_phases(s)) for s in STEPS] == [s["step"] for s in STEPS]


def test_the_pages_phase_order_is_the_servers():
    from sglang_ctxprof.model.records import LEAF_ORDER

    js = ui.read("app.js").decode()
    order = re.search(r"const LEAF_ORDER = \[([^\]]*)\]", js).group(1)
    assert tuple(re.findall(r'"([a-z_]+)"', order)) == LEAF_ORDER


def test_the_page_reads_acceptance_by_the_requests_own_context():
    js = ui.read("app.js").decode()
    body = js[js.index("function positionChart(p)"):]
    assert re.search(r"const bs = \(p\.acceptance_by_ctx \|\| \[\]\)", body[:400])
