"""Speculation against plain decode on real CPU servers: the ledger, planted causes, slow steps.

Two servers of the tiny DeepSeek-V3 (MLA + MoE), started side by side: one with the identity EAGLE
head and the test-only ``ctxprof_plant`` plugin, one plain (no speculation, same attention backend).
``sweep --arms spec,plain`` runs the same prompts on both, interleaved, at two contexts:

1. clean: the plain arm is profiled (decode attention / MoE / rest); per context and interleaved pair,
   the ledger's speedup from that pair's own steps (accepted tokens per step, step time, host gap)
   against the same pair's measured speedup (the long request's decode on the server's wall clock):
   the median over the pairs of |predicted / measured - 1| is at most 10%.  Both sides come from the
   same steps, so the machine's load cancels: an accounting check, not a timing threshold;
2. a verify-only attention slowdown growing with context: verify inflation grows with context, the
   crossover moves to a shorter context and the ledger names the verify attention path;
3. a constant host delay per step: it shows as overhead (the ledger's overhead of each interleaved
   pair grows by the planted amount, inside net saved), verify inflation does not change.  Net saved
   itself is not compared across the two sweeps: on a shared CPU the plain arm's step moves more than
   the delay between runs;

Comparisons across sweeps are made per interleaved pair (the two arms' points of one repeat ran back
to back, so the machine's state is shared), and at the long context where a ratio of attention
times is more than noise: other tenants of a 2-core machine slowed single repeats 10x.
4. the live server's ledger: the plain server's profile registered with ``POST /ctx_profile/plain``
   puts the ledger in ``/ctx_profile/diagnosis``, equal to ``diagnose --plain URL``'s; without a
   reference the JSON says why; and a few planted slow steps are set apart from the robust means.
5. plain decode under SGLang's overlap scheduler (on for the plain server on this CPU: SGLang turns it
   off here only for speculative algorithms): SGLang 0.5.23 keeps a request that finishes by length
   out of the next launched step (``_reqs_finishing_inflight``), but one that stops on a token rides
   along in it and SGLang skips its row.  Each finished request, by length and by a stop token, has
   ``completion_tokens - 1`` steps (one token per plain decode step; the first came from prefill)
   and the audit stays at 0.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import generate, http, rand_ids, start_server, tiny
from plant_rig import plant, planted_env
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.server import cpu_args
from sglang_ctxprof.aggregate.ledger import row as ledger_row
from sglang_ctxprof.cli.sweep_arms import _ledger_point, plain_args
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

CTX = ("64", "2048")
SWEEP = ["--ctx", *CTX, "--short", "4", "--long", "24", "--no-plots"]
# Three interleaved repeats everywhere: a median of three survives one repeat slowed by the other
# tenants of a shared machine (seen: 10x).
CLEAN_REPEATS = 3
PLANTED_REPEATS = 3
RUNS: dict = {}


def _start_both(spec_args, spec_env, plain_args_):
    """Both servers at once (each waits on its own start-up); stop whichever started if one fails."""
    out: dict = {}

    def go(name, args, env):
        try:
            out[name] = start_server(name, args, env=env)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after both finished
            out[name + "-error"] = exc

    ts = [threading.Thread(target=go, args=("arms-spec", spec_args, spec_env)),
          threading.Thread(target=go, args=("arms-plain", plain_args_, None))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    errors = [v for k, v in out.items() if k.endswith("-error")]
    if errors:
        for k in ("arms-spec", "arms-plain"):
            if k in out:
                out[k].stop()
        raise errors[0]
    return out["arms-spec"], out["arms-plain"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("arms")
    env, plant_file = planted_env(d)
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    spec_args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile"]
    spec, plain = _start_both(spec_args, env, plain_args(spec_args))
    spec.plant_file, spec.dir = plant_file, d
    try:
        yield spec, plain
    finally:
        spec.stop()
        plain.stop()


def arms(servers, name, repeats=PLANTED_REPEATS):
    spec, plain = servers
    out = spec.dir / name
    assert main(["sweep", "--url", spec.url, "--plain-url", plain.url, "--arms", "spec,plain",
                 "--out", str(out), "--repeat", str(repeats)] + SWEEP) == 0
    rep = json.loads((out / "arms.json").read_text())
    RUNS[name] = rep
    return rep, out


def _rows(rep):
    return {round(r["ctx"]): r for r in rep["ledger"]["rows"]}


def test_clean_arms_plain_profiled_and_the_ledger_predicts_the_measured_speedup(servers, capsys):
    rep, out = arms(servers, "clean", CLEAN_REPEATS)
    printed = capsys.readouterr().out
    assert "speculative vs plain decode" in printed and "speculation ledger" in printed
    for f in (out / "plain").glob("point-*.json"):
        ph = json.loads(f.read_text())["breakdown"]["phases_ms"]
        assert ph["decode_attn"] > 0 and ph["decode_moe"] > 0 and ph["decode_rest"] > 0 and "verify" not in ph
        assert ph["decode"] == pytest.approx(ph["decode_attn"] + ph["decode_moe"] + ph["decode_rest"], rel=1e-6)
    assert [t["ctx"] for t in rep["table"]] == [int(c) for c in CTX]
    for t in rep["table"]:
        s = t["server"]  # measured on the server's wall clock: the long request's decode steps
        assert s["repeats"] == CLEAN_REPEATS and s["spec_tok_s"] > 0 and s["plain_tok_s"] > 0
        # per interleaved pair, the ledger's speedup from the pair's own steps against the pair's measured
        # speedup: median error at most 10% (saved runs: 1.7-4.1%, also with the machine loaded; the pair
        # whose last step accepts past max_new_tokens reads up to +11%, a miscounted bonus token ~ -30%)
        pairs = [(a["repeat"], a["predicted"], a["measured"], a["point_predicted"]) for a in t["pairs"]]
        assert len(pairs) == CLEAN_REPEATS and t["pair_error"] <= 0.10, \
            (t["ctx"], t["pair_error"], "(repeat, predicted, measured, pooled point's prediction):", pairs)
        assert t["predicted_speedup"] > 0
    led = rep["ledger"]
    assert led["available"] and all(r["plain_from"] == "measured" for r in led["rows"])
    assert all(r["verify_inflation"] > 0 and r["moe_inflation"] > 0 for r in led["rows"])
    assert rep["crossover"]["how"] in ("measured", "extrapolated", "none")


def _pair_inflation(out, ctx):
    """Verify attention over plain decode attention per interleaved pair (the two arms' points of one
    repeat, run back to back: the machine's drift between sweeps cancels), median over the pairs."""
    def attn(arm, phase):
        return {json.loads(f.read_text())["repeat"]: json.loads(f.read_text())["breakdown"]["phases_ms"][phase]
                for f in (out / arm).glob(f"point-c{ctx:06d}-r*.json")}
    va, da = attn("spec", "verify_attn"), attn("plain", "decode_attn")
    return statistics.median(va[r] / da[r] for r in va if r in da and da[r] > 0)


def _pair_overhead(out, ctx):
    """The ledger's overhead_extra of each interleaved pair (``aggregate.ledger.row`` on the two arms'
    points of one repeat, as ``sweep --arms`` predicts per pair), median over the pairs."""
    def points(arm):
        return {p["repeat"]: _ledger_point(p) for p in (json.loads(f.read_text())
                                                        for f in (out / arm).glob(f"point-c{ctx:06d}-r*.json"))}
    sp, pp = points("spec"), points("plain")
    return statistics.median(ledger_row(sp[r], [pp[r]])["spent_ms"]["overhead_extra"] for r in sp if r in pp)


def _cross(rep):
    """The crossover as a number: the context, 0 when speculation is slower already at the shortest
    context measured, infinity when it keeps paying."""
    c = rep["crossover"]
    if c.get("ctx") is not None:
        return c["ctx"]
    return 0.0 if "slower already" in c["note"] else float("inf")


# The two planted sweeps compare whole sweeps run minutes apart: on a 2-core machine shared with
# other load they failed (a 12 ms host-delay swing; a crossover moved by noise), so they run when asked.
PLANTED = pytest.mark.skipif(os.environ.get("CTXPROF_ARMS_PLANTED") != "1",
                             reason="opt-in: CTXPROF_ARMS_PLANTED=1 (whole-sweep comparisons, noisy when shared)")


@PLANTED
def test_planted_verify_attention_slowdown_is_named_and_moves_the_crossover(servers):
    spec, _ = servers
    # verify only (plain decode never runs a target-verify batch), and large: at the long context it
    # adds far more than a shared machine's swings; at the short one almost nothing
    plant(spec, attn_ms_per_1k=12.0)
    try:
        rep, out = arms(servers, "verify_slow")
    finally:
        plant(spec)
    hi = int(CTX[-1])
    infl = [r["verify_inflation"] for r in rep["ledger"]["rows"]]
    assert infl[-1] > infl[0]  # verify inflation grows with context
    # per interleaved pair, at the long context, well above the clean run's
    assert _pair_inflation(out, hi) > 2 * _pair_inflation(spec.dir / "clean", hi)
    a = rep["ledger"]["attention"]
    assert a["scales_worse"] and "the verify attention path scales worse than decode attention" in a["verdict"]
    assert "the verify attention path scales worse" in rep["ledger"]["verdict"]
    assert _cross(rep) < float("inf") and _cross(rep) <= _cross(RUNS["clean"])


@PLANTED
def test_planted_host_delay_is_overhead_and_leaves_verify_inflation(servers):
    spec, _ = servers
    plant(spec, host_spin_ms=20.0)  # busy: a sleep would let other processes cool the core's caches
    try:
        rep, out = arms(servers, "host_delay")
    finally:
        plant(spec)
    clean_out = spec.dir / "clean"
    for ctx, r in _rows(rep).items():
        # the planted delay is overhead: per interleaved pair (a pair's phases are means over the same
        # steps, so they add up; medians over repeats, per phase, need not), median over the pairs
        grew = _pair_overhead(out, ctx) - _pair_overhead(clean_out, ctx)
        assert grew == pytest.approx(20.0, rel=0.4), (ctx, grew)
        # and net saved carries it: net = saved - spent, the delay inside spent's overhead
        assert r["net_ms"] == pytest.approx(r["saved_ms"] - sum(r["spent_ms"].values()), abs=1e-6)
    # none of it is charged to verify attention: at the long context verify attention (median over
    # the repeats) moved by far less than the planted 20 ms (a ratio against plain decode attention
    # measured seconds apart moved 0.9 -> 1.5 between two sweeps on a shared machine)
    hi = int(CTX[-1])
    va = [statistics.median(json.loads(f.read_text())["breakdown"]["phases_ms"]["verify_attn"]
                            for f in (d / "spec").glob(f"point-c{hi:06d}-r*.json")) for d in (out, clean_out)]
    assert abs(va[0] - va[1]) < 0.5 * 20.0, va


def _post_profile(url, body, source):
    req = urllib.request.Request(f"{url}{names.ROUTE_PLAIN}?source={source}", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_live_ledger_against_a_registered_plain_reference(servers, capsys):
    spec, plain = servers
    for srv in servers:  # the same requests on both servers, at a short and a long context
        assert http("POST", srv.url + "/ctx_profile/reset")[0] == 200
        for n, seed in ((80, 7), (2000, 8)):
            generate(srv.url, rand_ids(n, seed=seed), max_new_tokens=24)
    # without a reference the JSON says why, and invents nothing
    status, d = http("GET", spec.url + names.ROUTE_DIAGNOSIS)
    assert status == 200 and d["ledger"]["available"] is False and "rows" not in d["ledger"]
    assert d["ledger"]["reason"].startswith("no plain-decode reference registered"), d["ledger"]
    assert d["whatif"]["draft_budget"] and all("(assumed)" not in a["measured"] and "plain step" not in a["measured"]
                                               for a in d["whatif"]["draft_budget"])
    status, pd = http("GET", plain.url + names.ROUTE_DIAGNOSIS)
    assert status == 200 and pd["ledger"]["reason"].startswith("this server decodes without speculation")
    # a speculative profile is refused as the plain reference
    status, err = _post_profile(spec.url, http("GET", spec.url + "/ctx_profile")[1], "itself")
    assert status == 400 and "speculative steps (EAGLE)" in err["error"], err
    # the plain server's profile, registered: the diagnosis carries the ledger
    body = http("GET", plain.url + "/ctx_profile")[1]
    status, reg = _post_profile(spec.url, body, "arms-plain")
    assert status == 200 and reg["registered"] and reg["source"] == "arms-plain", reg
    assert reg["steps"] == sum(b["steps"] for b in body["buckets"])
    assert http("GET", spec.url + names.ROUTE_PLAIN)[1]["buckets"] == reg["buckets"]
    status, d = http("GET", spec.url + names.ROUTE_DIAGNOSIS)
    assert status == 200, d
    led = d["ledger"]
    assert led["available"] and led["plain_source"] == "plain reference: arms-plain", led
    prof = http("GET", spec.url + "/ctx_profile")[1]
    spec_labels = [b["label"] for b in prof["buckets"] if b["steps"]]
    assert [r["label"] for r in led["rows"]] == spec_labels and len(spec_labels) >= 2
    for r in led["rows"]:
        assert r["plain_from"] == "measured" and r["verify_inflation"] > 0 and r["moe_inflation"] > 0
        assert r["speedup"] == pytest.approx(r["al"] * r["plain_step_ms"] / r["step_ms"])
        assert r["saved_ms"] - sum(r["spent_ms"].values()) == pytest.approx(r["net_ms"])
    assert led["verdict"] in d["headline"]
    assert d["whatif"]["draft_budget"] and all("plain step at this context" in a["measured"]
                                               for a in d["whatif"]["draft_budget"])
    # the same ledger as the CLI's, which fetches both servers itself
    capsys.readouterr()
    assert main(["diagnose", "--url", spec.url, "--plain", plain.url, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["ledger"]
    assert [(r["label"], r["speedup"]) for r in cli["rows"]] == \
        [(r["label"], pytest.approx(r["speedup"], rel=1e-9)) for r in led["rows"]]
    text = http("GET", spec.url + names.ROUTE_DIAGNOSIS + "?format=text")[1]
    assert "speculation ledger (per spec step" in text and "plain reference: arms-plain" in text
    # bad registrations lose nothing; DELETE forgets the reference
    assert _post_profile(spec.url, {"buckets": "x"}, "bad")[0] == 400
    assert http("GET", spec.url + names.ROUTE_PLAIN)[1]["source"] == "arms-plain"
    assert http("DELETE", spec.url + names.ROUTE_PLAIN)[1] == {"ok": True, "removed": True}
    assert http("GET", spec.url + names.ROUTE_DIAGNOSIS)[1]["ledger"]["available"] is False


def test_planted_slow_steps_are_set_apart(servers):
    spec, _ = servers
    # a few slow steps (300 ms each, as a kernel compiling) in the short bucket
    assert http("POST", spec.url + "/ctx_profile/reset")[0] == 200
    plant(spec, stall_steps=3, stall_ms=300.0)
    try:
        generate(spec.url, rand_ids(80, seed=7), max_new_tokens=40)
    finally:
        plant(spec)
    generate(spec.url, rand_ids(3000, seed=8), max_new_tokens=40)
    status, d = http("GET", spec.url + "/ctx_profile/diagnosis")
    assert status == 200, d
    # the planted stalls are set apart (a shared machine may add slow steps of its own), named, and
    # the bucket's robust mean is the mean without them; which context is slower is the machine's
    # business here (the unit test holds the headline's direction with planted steps)
    flag = [f for f in d["flags"] if f["kind"] == "outlier_steps" and f["message"].startswith("bucket 64-127: ")]
    assert flag, d["flags"]
    outs = d["outliers"]["64-127"]["outliers"]
    stalled = [o for o in outs if o["step_ms"] >= 300.0 and o["phase"] == "verify_attn"]  # each holds a 300 ms stall
    assert len(stalled) >= 3, outs
    prof = http("GET", spec.url + "/ctx_profile")[1]
    b = next(b for b in prof["buckets"] if b["label"] == "64-127")
    assert d["outliers"]["64-127"]["step_ms"] < b["phases"]["step"]["mean_ms"]
    assert "slow steps set apart" in d["headline"] and "64-127" in d["headline"]


def test_plain_decode_under_overlap_counts_only_the_steps_sglang_counts(servers):
    _, plain = servers
    st, info = http("GET", plain.url + "/get_server_info")
    assert st == 200 and info.get("disable_overlap_schedule") is False, {
        k: v for k, v in info.items() if "overlap" in k}  # SGLang's overlap scheduler is on
    assert http("POST", plain.url + "/ctx_profile/reset")[0] == 200
    mix = [(60 + 130 * i, (1, 2, 5, 9, 17, 23, 31, 40)[i]) for i in range(8)]  # ends at different steps
    with ThreadPoolExecutor(len(mix)) as ex:
        outs = list(ex.map(lambda m: generate(plain.url, rand_ids(m[0], seed=80 + m[1]), m[1]), mix))
    time.sleep(1.0)
    got = []
    for o in outs:
        mi = o["meta_info"]
        st, r = http("GET", f"{plain.url}/ctx_profile/requests/{mi['id']}")
        assert st == 200 and r["finished"] is True, r
        got.append((mi["completion_tokens"], r["steps"], 1 + r["committed"], r["prompt_tokens"], mi["prompt_tokens"]))
    print("plain overlap (completion_tokens, steps, 1 + committed, prompt ours, prompt SGLang's):", got)
    assert all(steps == c - 1 and c1 == c and p == q for c, steps, c1, p, q in got), got
    # the same prompts again, each stopping on a token of its own greedy output: a finish SGLang
    # cannot see coming, so the request is already in the next launched step
    stops = []
    for (n, mt), o in zip(mix, outs):
        ids = o["output_ids"]
        k = next((i for i in range(mt // 2, len(ids) - 1) if ids[i] not in ids[:i]), None)
        if k is not None:
            stops.append((n, mt, ids[k]))

    def stop_run(m):
        st, out = http("POST", plain.url + "/generate", {"input_ids": rand_ids(m[0], seed=80 + m[1]), "sampling_params": {
            "max_new_tokens": m[1], "temperature": 0, "stop_token_ids": [m[2]]}})  # ignore_eos skips stop ids
        assert st == 200, out
        return out

    with ThreadPoolExecutor(len(stops)) as ex:
        outs2 = list(ex.map(stop_run, stops))
    time.sleep(1.0)
    by_stop = []
    for o in outs2:
        mi = o["meta_info"]
        r = http("GET", f"{plain.url}/ctx_profile/requests/{mi['id']}")[1]
        by_stop.append(((mi.get("finish_reason") or {}).get("type"), mi["completion_tokens"], r["steps"],
                        1 + r["committed"], r["finished"]))
    print("plain overlap, stopped on a token (finish, completion_tokens, steps, 1 + committed, finished):", by_stop)
    assert sum(1 for f, *_ in by_stop if f == "stop") >= 2, by_stop
    assert all(steps == c - 1 and c1 == c and fin for _, c, steps, c1, fin in by_stop), by_stop
    st, status = http("GET", plain.url + "/ctx_profile/status")
    (rank,) = status["ranks"]
    a = rank["status"]["audit"]
    assert a["checked"]["requests"] >= len(mix) and a["violations"] == dict.fromkeys(names.AUDIT_INVARIANTS, 0), a
