"""Planted causes on a real CPU server, each found and named by the diagnosis.

One server (tiny DeepSeek-V3, MLA + MoE, identity EAGLE head) with the test-only ``ctxprof_plant``
plugin, whose planted causes the test switches between phases through a JSON file:

1. baseline: nothing planted.  Exec mode reads "eager (CUDA graphs disabled)"; acceptance by
   position equals an independent count from the same run's per-request step rows.
2. attention slowdown growing with context: ``diagnose --baseline`` says "regression in
   verify_attn" with a larger slope; without a baseline the slope grew.
3. acceptance falling with context (SGLang's own simulate setting above a context): the
   decomposition charges the drop to acceptance, not to step time.
4. host sleep in the scheduler loop: the request waterfall shows it as host gaps and its parts add
   up to the wall time within 2%.
"""

from __future__ import annotations

import json

import pytest

from conftest import generate, http, rand_ids, tiny
from plant_rig import plant, start_planted
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.model.buckets import Bucketing

pytestmark = pytest.mark.server

CTX = (64, 1024, 3072)
NEW = 24
RESULTS: dict = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile"]
    srv = start_planted("diagnosis-plant", args, tmp_path_factory.mktemp("plant"))
    try:
        generate(srv.url, rand_ids(64, seed=1), max_new_tokens=8)  # warm-up: the first steps compile/allocate
        yield srv
    finally:
        srv.stop()


def phase(server, name, ctxs=CTX, new=NEW):
    """Reset, send one request per context (sequential: batch size 1), save the profile."""
    assert http("POST", server.url + "/ctx_profile/reset")[0] == 200
    outs = [generate(server.url, rand_ids(n, seed=300 + n), max_new_tokens=new) for n in ctxs]
    status, body = http("GET", server.url + "/ctx_profile")
    assert status == 200, body
    path = server.dir / f"{name}.json"
    path.write_text(json.dumps(body))
    RESULTS[name] = (outs, body, path)
    return outs, body, path


def test_baseline_exec_mode_and_acceptance_by_position(server, capsys):
    outs, body, _ = phase(server, "baseline")
    # prefill buckets are the prompt length (fresh prompts: nothing cached)
    pf = {p["label"]: p for p in body["prefill"]}
    assert {"64-127", "1024-2047", "2048-4095"} <= set(pf), list(pf)
    assert sum(p["tokens"] for p in body["prefill"]) == sum(CTX)
    for b in body["buckets"]:
        assert b["exec_mode"]["eager"] == b["steps"] and b["exec_mode"]["downgrade"] is False
        assert b["exec_mode"]["reason"] == "CUDA graphs disabled"
    status, d = http("GET", server.url + "/ctx_profile/diagnosis")
    assert status == 200, d
    assert "no downgrade (eager (CUDA graphs disabled))" in d["headline"]
    assert d["physics"]["available"] is False
    status, text = http("GET", server.url + "/ctx_profile/diagnosis?format=text")
    assert status == 200 and d["headline"] in text
    with capsys.disabled():
        print("\n" + text)
    # independent count: each request's own step rows, bucketed by the row's own context
    bk = Bucketing.parse("pow2")
    hist: dict[str, list[int]] = {}
    for o in outs:
        status, r = http("GET", server.url + "/ctx_profile/requests/" + o["meta_info"]["id"])
        assert status == 200, r
        assert len(r["step_rows"]) == o["meta_info"]["spec_verify_ct"]
        for row in r["step_rows"]:
            h = hist.setdefault(bk.label(bk.index(row["ctx_len"])), [0] * 4)
            h[row["accepted"] - 1] += 1
    got = {a["label"]: a["acceptance_by_position"] for a in body["acceptance_by_ctx"]}
    assert {lbl: v["hist"] for lbl, v in got.items()} == hist
    for lbl, v in got.items():
        n = sum(hist[lbl])
        assert v["p"] == pytest.approx([sum(hist[lbl][i:]) / n for i in (1, 2, 3)])
        assert v["mean_len"] == pytest.approx(sum(i * c for i, c in enumerate(hist[lbl], 1)) / n)


def test_attention_slowdown_is_a_regression_in_verify_attn(server, capsys):
    if "baseline" not in RESULTS:
        phase(server, "baseline")
    plant(server, attn_ms_per_1k=4.0)
    try:
        _, body, path = phase(server, "slow_attn")
    finally:
        plant(server)
    base = RESULTS["baseline"][1]
    assert body["fits"]["verify_attn"]["robust"]["ms_per_1k_ctx"] > \
        base["fits"]["verify_attn"]["robust"]["ms_per_1k_ctx"]  # the slope grows
    capsys.readouterr()
    assert main(["diagnose", str(path), "--baseline", str(RESULTS["baseline"][2])]) == 1
    out = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + out)
    assert "regression in verify_attn" in out.split("\n")[2]
    assert main(["diagnose", str(path), "--baseline", str(RESULTS["baseline"][2]), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    top = d["baseline"]["regressions"][0]
    assert top["phase"] == "verify_attn" and top["slope_now"] > top["slope_baseline"]


def test_falling_acceptance_is_charged_to_acceptance(server, capsys):
    plant(server, acc_len_above=[512, 1.0])
    try:
        _, body, path = phase(server, "low_accept")
    finally:
        plant(server)
    capsys.readouterr()
    assert main(["diagnose", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    dec = d["decomposition"]
    assert dec["hi"]["al"] == pytest.approx(1.0) and dec["lo"]["al"] > 2
    assert dec["acceptance_share"] > 0.5 > dec["step_time_share"]
    assert "acceptance falls" in d["headline"]
    assert any(f["kind"] == "acceptance_falls" for f in d["flags"])
    with capsys.disabled():
        print("\nlow acceptance: " + d["headline"])


def test_host_sleep_shows_as_host_gaps_and_the_waterfall_adds_up(server, capsys):
    plant(server, host_sleep_ms=40)
    try:
        outs, body, _ = phase(server, "host_sleep", ctxs=(300,), new=20)
    finally:
        plant(server)
    rid = outs[0]["meta_info"]["id"]
    status, r = http("GET", server.url + "/ctx_profile/requests/" + rid)
    assert status == 200, r
    w = r["waterfall"]
    parts = sum(w["own_steps_ms"].values()) + w["others_prefill_ms"] + w["other_decode_ms"] + w["host_gaps_ms"]
    assert parts == pytest.approx(w["wall_ms"], rel=0.02)
    steps = r["steps"]
    assert w["host_gaps_ms"] >= 40 * (steps - 1)  # the planted sleep, between every pair of steps
    assert w["batch_sharing_ms"] == 0.0 and w["timeline_complete"] is True
    capsys.readouterr()
    assert main(["trace", "--url", server.url, rid]) == 0
    out = capsys.readouterr().out
    assert "host gaps (scheduler)" in out
    with capsys.disabled():
        print("\n" + out[:1500])
    status, d = http("GET", server.url + "/ctx_profile/diagnosis")
    assert any(f["kind"] == "host_bubbles" for f in d["flags"]), d["flags"]
