"""Look, don't read: the live page in a real browser, the board through a real Prometheus, the
Perfetto export, and the fleet view, all against real CPU servers.

One server (tiny DeepSeek-V3 + EAGLE, ``--enable-ctx-profile --enable-metrics --admin-api-key``) serves
every check; a real Prometheus (Debian's) scrapes it every 2 s from before the first request; headless
Chromium (Debian's, driven by selenium) loads ``/ctx_profile/ui``.  The fleet check starts a second
tiny server next to it.  The optional parts other branches add to the JSON (per-position acceptance,
exec mode, diagnosis, waterfall, own cost) are shown to the same browser by a stdlib server giving
the contract's shapes.  In CI (``CI=true``) a missing browser or Prometheus fails the test; on a
developer machine it skips, naming the apt packages.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

import ctxprof_ref
from conftest import LOG_DIR, ROOT, generate, http, rand_ids, start_server
from sglang_ctxprof.cli.server import free_port
from sglang_ctxprof.model import names

pytestmark = pytest.mark.server

ADMIN_KEY = "ui-admin-key"
R = names.ROUTE
DASH = ROOT / "dashboards"
CLI = [sys.executable, "-m", "sglang_ctxprof.cli.main"]
# substitutions a test makes for Grafana's variables (All selected; the window of the test run)
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "5m", "$instance": ".*", "$model": ".*"}


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    msg = f"{', '.join(missing)} not installed: apt-get install -y chromium chromium-driver prometheus (.ci/run does)"
    if os.environ.get("CI") == "true":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def server():
    srv = start_server("ui", ctxprof_ref.model_args() + [names.CLI_FLAG, "--enable-metrics",
                                                          "--admin-api-key", ADMIN_KEY])
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """Debian's Prometheus scraping the server every 2 s, with our rules, started before traffic."""
    _need("prometheus", "promtool")
    d = tmp_path_factory.mktemp("prom")
    port = free_port()
    target = urllib.parse.urlparse(server.url).netloc
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 1s}\n"
        f"rule_files: ['{DASH / 'ctxprof-rules.yml'}']\n"
        f"scrape_configs: [{{job_name: sglang, static_configs: [{{targets: ['{target}']}}]}}]\n")
    log = open(LOG_DIR / "ui-prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while time.time() - t0 < 120:
            assert proc.poll() is None, open(LOG_DIR / "ui-prometheus.log").read()[-2000:]
            st, body = http("GET", url + "/api/v1/query?query=up", timeout=5) if _up(url) else (0, None)
            if st == 200 and any(r["value"][1] == "1" for r in body["data"]["result"]):
                break
            time.sleep(1)
        else:
            raise AssertionError("Prometheus never scraped the server")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _up(url: str) -> bool:
    try:
        return http("GET", url + "/-/ready", timeout=2)[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def traffic(server, prometheus):
    """Requests at three contexts, twice, and two sharing batches, while Prometheus scrapes.

    Prometheus computes a rate from two samples of a series: the first round creates the series
    (labelled children appear on first use), the second moves them after they were scraped."""
    outs = []
    for _ in range(2):
        outs += [generate(server.url, rand_ids(n, seed=n + len(outs)), max_new_tokens=16) for n in (64, 700, 1500)]
        time.sleep(5)  # at least two scrapes in between
    with cf.ThreadPoolExecutor(2) as ex:
        outs += [f.result() for f in [ex.submit(generate, server.url, rand_ids(n, seed=900 + n), 12) for n in (300, 1500)]]
    time.sleep(5)  # a few more scrapes and rule evaluations after the last step
    return outs


def _profile(url: str) -> dict:
    st, body = http("GET", url + R)
    assert st == 200, body
    return body


# ---------------------------------------------------------------------------------------------- Prometheus
def _exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every expression of the dashboard and the rules."""
    import yaml

    dash = json.loads((DASH / "ctxprof-grafana.json").read_text())
    out = []
    for p in dash["panels"]:
        for t in p["targets"]:
            e = t["expr"]
            for k, v in GRAFANA_VARS.items():
                e = e.replace(k, v)
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", e))
    for g in yaml.safe_load((DASH / "ctxprof-rules.yml").read_text())["groups"]:
        for r in g["rules"]:
            out.append((f"rule {r.get('record') or r.get('alert')}", r["expr"].strip()))
            if "record" in r:
                out.append((f"recorded {r['record']}", r["record"]))
    return out


def test_promtool_checks_the_rules():
    _need("promtool")
    p = subprocess.run(["promtool", "check", "rules", str(DASH / "ctxprof-rules.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def _phase_series(instance: str, phases: dict[str, float], steps: int = 10, stale: tuple = ()) -> list[dict]:
    """Input series for ``promtool test rules``: one instance's phase histogram in one context bucket,
    one decode step a minute, each phase ``phases[ph]`` ms a step; a ``stale`` phase only in the first
    3 steps (its series stays, flat: a forward whose split was timed a while, then not)."""
    out = []
    for ph, ms in phases.items():
        labels = f'instance="{instance}", model_name="m", phase="{ph}", ctx_bucket="0-1k"'
        grow, flat = (3, steps - 3) if ph in stale else (steps, 0)
        rest = (lambda v: f" {v}x{flat}") if flat else (lambda v: "")
        out.append({"series": f"sglang_ctxprof_phase_seconds_sum{{{labels}}}",
                    "values": f"0+{ms / 1000}x{grow}" + rest(grow * ms / 1000)})
        out.append({"series": f"sglang_ctxprof_phase_seconds_count{{{labels}}}", "values": f"0+1x{grow}" + rest(grow)})
    return out


SPEC_WHOLE = {"step": 12.0, "draft": 2.0, "verify": 8.0, "draft_extend": 1.0, "overhead": 1.0}
SPEC_SPLIT = {**SPEC_WHOLE, "verify_attn": 3.0, "verify_moe": 4.0, "verify_rest": 1.0}
SPLIT = ("verify_attn", "verify_moe", "verify_rest")


@pytest.mark.parametrize("fleet", [
    pytest.param([({"step": 10.0, "decode": 9.0, "decode_attn": 2.0, "decode_moe": 5.0, "decode_rest": 2.0,
                    "overhead": 1.0}, ())], id="plain-decode-split"),
    pytest.param([(SPEC_WHOLE, ())], id="speculative-verify-whole"),
    pytest.param([(SPEC_SPLIT, ())], id="speculative-verify-split"),
    pytest.param([(SPEC_SPLIT, SPLIT)], id="split-earlier-then-whole"),
    pytest.param([(SPEC_SPLIT, ()), ({**SPEC_WHOLE, "step": 24.0, "verify": 20.0}, ())], id="mixed-fleet"),
])
def test_the_stacked_phase_panel_draws_the_leaves_that_add_up_to_the_step(fleet, tmp_path):
    """The board's stacked panel draws a step's leaf phases (``records.leaf_phases``, as the page
    does), each as its mean share of the selected instances' steps, so the stack adds up to their mean
    step: a plain server's decode split; a forward timed whole as itself, also where its parts'
    series stay from steps before the range, and beside an instance that splits it.  Evaluated by
    Prometheus itself (``promtool test rules``) on the series our metrics export (one step a minute
    per instance; a ``stale`` phase only before the range)."""
    _need("promtool")
    import yaml

    from sglang_ctxprof.model.records import leaf_phases

    panel = json.loads((DASH / "ctxprof-grafana.json").read_text())["panels"][0]
    expr = panel["targets"][0]["expr"]
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    share: Counter = Counter()
    series = []
    for i, (phases, stale) in enumerate(fleet):
        leaves = leaf_phases(set(phases) - set(stale))  # what the range's steps timed
        assert sum(phases[p] for p in leaves) == pytest.approx(phases["step"])
        share.update({p: phases[p] / len(fleet) for p in leaves})
        series += _phase_series(f"i{i}", phases, stale=stale)
    mean_step = sum(phases["step"] for phases, _ in fleet) / len(fleet)
    assert sum(share.values()) == pytest.approx(mean_step)
    want = [{"labels": f'{{ctx_bucket="0-1k", phase="{p}"}}', "value": v} for p, v in sorted(share.items())]
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": f"round({expr}, 0.001)", "eval_time": "10m", "exp_samples": want}]}]}))
    p = subprocess.run(["promtool", "test", "rules", str(tmp_path / "t.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_dashboard_and_rule_expression_answers(server, prometheus, traffic):
    # recording rules are evaluated every second; wait until the last group has produced its series
    t0 = time.time()
    while time.time() - t0 < 60:
        st, body = http("GET", prometheus + "/api/v1/query?query=" + urllib.parse.quote("ctxprof:position_acceptance:ratio5m"))
        if st == 200 and body["data"]["result"]:
            break
        time.sleep(1)
    report, empty = {}, []
    for where, expr in _exprs():
        st, body = http("GET", prometheus + "/api/v1/query?query=" + urllib.parse.quote(expr))
        assert st == 200 and body["status"] == "success", (where, expr, body)  # parses and evaluates
        res = body["data"]["result"]
        values = [float(r["value"][1]) for r in res]
        report[where] = {"series": len(res), "sample": [{**r["metric"], "value": r["value"][1]} for r in res[:4]]}
        may_be_empty = "offset 1d" in expr or where.startswith("rule CtxProfVerifyAttentionSlower")
        if not may_be_empty:
            assert res, (where, expr)
            assert any(math.isfinite(v) for v in values), (where, values)
        elif not res:
            empty.append(where)
    (LOG_DIR / "ui-prometheus-panels.json").write_text(json.dumps(report, indent=1))
    # the board's variables (Grafana's label_values) through the same API
    for label in ("instance", "model_name"):
        st, body = http("GET", prometheus + f"/api/v1/label/{label}/values?match[]=sglang_ctxprof_steps_total")
        assert st == 200 and body["data"], (label, body)
    # the live counters agree with /ctx_profile (same records, same buckets)
    prof = _profile(server.url)
    st, body = http("GET", prometheus + "/api/v1/query?query=" + urllib.parse.quote("sum(sglang_ctxprof_steps_total)"))
    assert int(float(body["data"]["result"][0]["value"][1])) == prof["totals"]["decode_steps"]


# ---------------------------------------------------------------------------------------------- trace export
def _ns(us: float) -> int:
    return int(round(us * 1000))


def check_trace(body: dict) -> dict[int, list[dict]]:
    """Chrome trace-event format: required fields; phases tile their step; steps in time order per track."""
    ev = body["traceEvents"]
    assert isinstance(ev, list) and ev
    for e in ev:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M") and isinstance(e["pid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["ts"], (int, float)) and e["dur"] >= 0, e
        else:
            assert isinstance(e["args"]["name" if e["name"].endswith("_name") else "sort_index"], (str, int)), e
    json.dumps(body)
    steps: dict[int, list[dict]] = {}
    for e in ev:
        if e["ph"] == "X" and e.get("cat") in ("decode", "prefill"):
            steps.setdefault(e["tid"], []).append(e)
    for tid, ss in steps.items():
        starts = [_ns(s["ts"]) for s in ss]
        assert starts == sorted(starts), tid  # time order per track
        for a, b in zip(ss, ss[1:]):
            assert _ns(a["ts"]) + _ns(a["dur"]) <= _ns(b["ts"]) + 1, (a, b)  # no overlap on one rank
        for s in ss:
            if s["cat"] != "decode":
                continue
            lo, hi = _ns(s["ts"]), _ns(s["ts"]) + _ns(s["dur"])
            inner = [e for e in ev if e["ph"] == "X" and e["tid"] == tid and e.get("cat") == "phase"
                     and lo <= _ns(e["ts"]) and _ns(e["ts"]) + _ns(e["dur"]) <= hi]
            top = [e for e in inner if e["name"] not in ("verify_attn", "verify_moe", "verify_rest")]
            assert [e["name"] for e in top][:2] == ["draft", "verify"], [e["name"] for e in top]
            cur = lo
            for e in top:  # the phases tile the step exactly (integer nanoseconds)
                assert _ns(e["ts"]) == cur, (s["args"], e)
                cur = _ns(e["ts"]) + _ns(e["dur"])
            assert abs(cur - hi) <= 1, (s["args"], cur, hi)
            v = next(e for e in top if e["name"] == "verify")
            kids = [e for e in inner if e["name"] in ("verify_attn", "verify_moe", "verify_rest")]
            cur = _ns(v["ts"])
            for k in kids:
                assert _ns(k["ts"]) == cur
                cur = _ns(k["ts"]) + _ns(k["dur"])
            assert abs(cur - (_ns(v["ts"]) + _ns(v["dur"]))) <= 1
            assert s["args"]["batch_size"] >= 1 and s["args"].get("ctx_mean", s["args"].get("ctx_len")) > 0
    return steps


def test_trace_json_recent_steps(server, traffic):
    st, body = http("GET", server.url + f"{R}/trace.json?last=5")
    assert st == 200, body
    steps = check_trace(body)
    assert len(steps) == 1  # one track per rank: this server has one
    names_ = [e["args"]["name"] for e in body["traceEvents"] if e["name"] == "thread_name"]
    assert names_ == ["rank tp0-dp0-pp0"]
    ss = next(iter(steps.values()))
    assert len(ss) == 5 and {"decode"} <= {s["cat"] for s in ss}
    assert body["otherData"]["max_last"] == names.MAX_TRACE_STEPS
    st, body = http("GET", server.url + f"{R}/trace.json?last={names.MAX_TRACE_STEPS}")
    ss = next(iter(check_trace(body).values()))
    prof = _profile(server.url)
    assert sum(s["cat"] == "decode" for s in ss) == prof["totals"]["decode_steps"]  # all kept (< the bound)
    assert sum(s["cat"] == "prefill" for s in ss) == prof["totals"]["prefill_batches"]
    for bad in ("last=0", f"last={names.MAX_TRACE_STEPS + 1}", "last=x", "rid=a&last=3", "rid=%01bad", "n=3"):
        st, body = http("GET", server.url + f"{R}/trace.json?{bad}")
        assert st == 400 and "error" in body, (bad, body)
    assert http("GET", server.url + f"{R}/trace.json?rid=no-such-request")[0] == 404


def test_trace_of_one_request_and_the_cli(server, traffic, tmp_path):
    rid = traffic[4]["meta_info"]["id"]
    out = tmp_path / "req.json"
    p = subprocess.run(CLI + ["trace", rid, "--perfetto", str(out), "--url", server.url], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "ui.perfetto.dev" in p.stdout
    body = json.loads(out.read_text())
    steps = check_trace(body)
    decode = [s for ss in steps.values() for s in ss if s["cat"] == "decode"]
    assert len(decode) == traffic[4]["meta_info"]["spec_verify_ct"]
    assert [s for ss in steps.values() for s in ss if s["cat"] == "prefill"]
    out2 = tmp_path / "recent.json"
    p = subprocess.run(CLI + ["trace", "--perfetto", str(out2), "--last", "5", "--url", server.url], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert sum(len(v) for v in check_trace(json.loads(out2.read_text())).values()) == 5


# ---------------------------------------------------------------------------------------------- the page
@pytest.fixture(scope="module")
def browser():
    _need("chromium", "chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def _wait(drv, js: str, timeout: float = 60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = drv.execute_script(js)
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"never true: {js}")


CANVAS_INK = """
const c = document.querySelector(arguments[0] + ' canvas'); if (!c) return -1;
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;"""


@pytest.fixture(scope="module")
def page(server, traffic, browser):
    browser.get(server.url + names.ROUTE_UI)
    _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
    return browser


def test_page_draws_every_chart_and_the_bucket_table(server, page):
    assert page.execute_script("return window.ctxprof.state.lastError") is None
    prof = _profile(server.url)
    for name in ("phases", "toks", "accept"):
        assert page.execute_script(CANVAS_INK, f"#chart-{name}") > 1000, name  # drawn, not blank
        data = page.execute_script(f"return window.ctxprof.charts['{name}'].data")
        assert len(data) >= 2 and any(v not in (None, 0) for s in data[1:] for v in s), (name, data)
    has_pos = any((a.get("acceptance_by_position") or {}).get("p") for a in prof.get("acceptance_by_ctx") or [])
    assert page.execute_script("return !document.getElementById('position-panel').hidden") == has_pos
    if has_pos:
        assert page.execute_script(CANVAS_INK, "#chart-position") > 1000
    # the phase chart's top series is the step total of each bucket (leaf phases add up to the step)
    top = page.execute_script("return window.ctxprof.charts['phases'].data[1]")
    for b, v in zip(prof["buckets"], top):
        assert v == pytest.approx(b["phases"]["step"]["mean_ms"], rel=1e-6)
    rows = page.execute_script(
        "return [...document.querySelectorAll('#buckets tbody tr')].map(r => [r.dataset.bucket, +r.dataset.steps,"
        " [...r.cells].map(c => c.textContent)])")
    assert [(r[0], r[1]) for r in rows] == [(b["label"], b["steps"]) for b in prof["buckets"]]
    for (_, _, cells), b in zip(rows, prof["buckets"]):
        assert cells[3] == f"{b['accepted_per_step']:.2f}" and cells[4] == f"{b['decode_tok_s']:.1f}"
        assert cells[5] == f"{b['phases']['step']['mean_ms']:.2f}"
    status = page.execute_script("return document.querySelector('#status tbody').textContent")
    assert "tp0-dp0-pp0" in status and "cpu" in status
    st, diag = http("GET", server.url + names.ROUTE_DIAGNOSIS)
    assert st == 200, diag
    assert not page.execute_script("return document.getElementById('diagnosis').hidden")
    assert page.execute_script("return document.getElementById('diag-headline').textContent") == diag["headline"]
    assert page.execute_script("return document.getElementById('ledger-verdict').textContent") == \
        "speculation ledger unavailable: " + diag["ledger"]["reason"]


def test_no_prompt_or_output_text_on_the_page(server, traffic, page):
    html = page.page_source
    texts = [o["text"] for o in traffic if len(o["text"].strip()) > 8]
    assert texts and not [t for t in texts if t in html]


def test_clicking_a_slow_request_opens_its_steps(server, page):
    row = page.find_element("css selector", "#slow tbody tr[data-rid]")
    rid = row.get_attribute("data-rid")
    row.click()
    _wait(page, "return !document.getElementById('detail').hidden && "
                "document.querySelectorAll('#steps tbody tr').length > 0")
    st, r = http("GET", f"{server.url}{R}/requests/{rid}")
    assert st == 200
    assert page.execute_script("return document.getElementById('detail-rid').textContent") == rid
    assert page.execute_script("return document.querySelectorAll('#steps tbody tr').length") == len(r["step_rows"])
    assert page.execute_script(CANVAS_INK, "#chart-steps") > 1000
    # the request's waterfall (where its wall time went) is drawn from the same route's body
    assert r["waterfall"] and r["waterfall"]["wall_ms"] > 0
    assert page.execute_script("return !document.getElementById('waterfall').hidden && "
                               "document.querySelectorAll('#waterfall div').length > 0")
    page.set_window_size(1400, page.execute_script("return document.body.scrollHeight") + 140)
    page.execute_script("window.scrollTo(0, 0)")
    time.sleep(1)
    page.save_screenshot(str(LOG_DIR / "ui.png"))


def test_reset_with_a_wrong_admin_key_is_refused_and_said(server, page):
    before = _profile(server.url)["totals"]["decode_steps"]
    page.find_element("id", "admin-key").send_keys("wrong-key")
    page.find_element("id", "reset").click()
    msg = _wait(page, "const m = document.getElementById('msg'); return !m.hidden && m.textContent")
    assert "refused" in msg and "401" in msg, msg
    assert page.execute_script("return document.getElementById('msg').className") == "error"
    assert _profile(server.url)["totals"]["decode_steps"] == before  # nothing was reset


def test_no_javascript_errors(page):
    logs = page.get_log("browser")
    js = [e for e in logs if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert not js, js
    # the only failed loads are the refused reset and routes this server does not have (yet)
    net = [e["message"] for e in logs if e["level"] == "SEVERE" and e.get("source") == "network"]
    assert all(re.search(r"/ctx_profile/(reset|diagnosis) ", m) for m in net), sorted(set(net))


def test_ui_cli_prints_the_address_without_a_browser(server):
    p = subprocess.run(CLI + ["ui", "--url", server.url, "--no-browser"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"no browser available; open {server.url}{names.ROUTE_UI}"
    st, text = http("GET", server.url + names.ROUTE_UI + "/nope.js")
    assert st == 404


# ---------------------------------------------------------------------------------------------- fleet
def test_fleet_merge_of_two_servers_is_the_sum(server, traffic):
    other = start_server("ui-fleet-b", ctxprof_ref.model_args() + [names.CLI_FLAG])
    try:
        for n in (100, 2100):
            generate(other.url, rand_ids(n, seed=40 + n), max_new_tokens=10)
        a, b = _profile(server.url), _profile(other.url)
        p = subprocess.run(CLI + ["show", "--json", "--url", server.url, "--url", other.url],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        m = out["merged"]
        for k in ("decode_steps", "prefill_batches", "accepted", "committed", "requests_tracked"):
            assert m["totals"][k] == a["totals"][k] + b["totals"][k], k
        by = {x["label"]: x for x in a["buckets"]}
        for x in b["buckets"]:
            by[x["label"]] = {k: by[x["label"]].get(k, 0) + x[k] for k in ("steps", "req_steps", "accepted")} \
                if x["label"] in by else x
        assert {x["label"]: (x["steps"], x["req_steps"], x["accepted"]) for x in m["buckets"]} == \
            {lab: (x["steps"], x["req_steps"], x["accepted"]) for lab, x in by.items()}
        for x in m["buckets"]:  # exact: the merged step time is the sum of both servers' totals
            parts = [y["phases"]["step"]["total_ms"] for y in a["buckets"] + b["buckets"] if y["label"] == x["label"]]
            assert x["phases"]["step"]["total_ms"] == pytest.approx(sum(parts), rel=1e-9)
        assert [s["url"] for s in out["servers"]] == [server.url, other.url]
        assert [s["decode_steps"] for s in out["servers"]] == [a["totals"]["decode_steps"], b["totals"]["decode_steps"]]
        text = subprocess.run(CLI + ["show", "--url", server.url, "--url", other.url], capture_output=True, text=True)
        assert text.returncode == 0 and "fleet of 2 servers" in text.stdout and other.url in text.stdout
    finally:
        other.stop()


# ---------------------------------------------------------------------------------------------- optional parts
def _capture(i: int, state: str = "", step_ids: list[int] | None = None, rid: str | None = None,
             trigger: str = "manual") -> dict:
    """A capture as ``collect.capture.CaptureInfo.to_dict`` serves it: ``cap-<i>``, requested at i s;
    ``cap-5`` was deleted by the byte cap, ``cap-3`` failed, the others are done."""
    state = state or {5: names.CAPTURE_DELETED, 3: names.CAPTURE_FAILED}.get(i, names.CAPTURE_DONE)
    return {"id": f"cap-{i}", "trigger": trigger, "steps": 4, "rid": rid, "reason": "", "state": state,
            "requested_ns": i * 1_000_000_000, "trigger_step": None, "step_ids": step_ids or [10 * i, 10 * i + 1],
            "rids": [rid] if rid else [], "start_ns": 0, "end_ns": 0, "sync_ns": [0, 0],
            "path": f"/tmp/caps/cap-{i}.trace.json.gz" if state == names.CAPTURE_DONE else None, "bytes": 0,
            "stop_ms": 0.0, "profiler_stop_ms": 0.0, "export_ms": 0.0, "export_gap_ms": 0.0, "export_steps": 0,
            "error": "no trace written" if state == names.CAPTURE_FAILED else ""}


def _contract_server():
    """A stdlib server giving the page the optional keys other parts add (CONTRACTS: per-position
    acceptance, exec mode, diagnosis, waterfall, own cost), on a profile built by a real Aggregator."""
    import http.server
    import threading

    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.views import ui
    from sglang_ctxprof.model.records import RankId, StepRecord
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    for i, ctx in enumerate((70, 80, 900, 3000, 3100)):
        ph = {"draft": 0.5, "verify": 3.0 + ctx / 1000, "verify_attn": 1 + ctx / 1000, "verify_moe": 1.5,
              "verify_rest": 0.5, "draft_extend": 0.75, "overhead": 0.3}
        agg.observe(StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("r0",),
                               ctx_lens=(ctx,), accepted=(4,), committed=(4,), finished=(False,), draft_tokens=4,
                               step_ms=4.55 + ctx / 1000, phases_ms=ph, t_start_ns=i * 10_000_000))
    prof = build_profile(agg.snapshot()).served(enabled=True, dropped=0, ranks=({"status": {}},)).to_dict()
    prof["acceptance_by_ctx"] = []
    for b in prof["buckets"]:
        b["acceptance_by_position"] = {"n_steps": b["steps"], "hist": [0, 1, 1, b["steps"] - 2],
                                       "p": [0.95, 0.8, 0.6], "c": [0.95, 0.84, 0.75], "mean_len": 3.4}
        prof["acceptance_by_ctx"].append({k: b[k] for k in ("label", "lo", "hi", "acceptance_by_position")})
        b["exec_mode"] = {"graph": 0, "eager": b["steps"], "piecewise": 0, "unknown": 0, "attn_backend": "intel_amx",
                          "downgrade": False, "reason": ""}
    status = {"schema_version": 1, "ranks": [{"status": {
        "enabled": True, "pid": 1, "rank": {"tp": 0, "dp": 0, "pp": 0}, "algorithm": "EAGLE", "timing": "cpu",
        "submitted": 5, "dropped": 0, "degraded": None, "hooks": {"a": "ok"},
        "cost": {"sched_us_per_step": 12.5, "sampled_steps": 5, "drain_us_per_record": 3.0, "events_per_step": None,
                 "step_share": 0.004, "drain_share": 0.0024, "total_share": 0.0064},
        "capture": {"triggers": {"slow_step": {"factor": 3.0, "run": 2, "on": True}, "host_gap": {"ms": 0, "on": False},
                                 "slow_request": {"on": False}},
                    "fired": {"manual": 6, "slow_step": 1}, "suppressed": {"slow_step": 2},
                    "captures": [_capture(i, rid="r0" if i == 2 else None) for i in range(7)]}}}]}
    # the shape of aggregate.waterfall: the terms tile wall_ms; batch sharing is a part of the own steps
    req = dict(agg.request("r0"), captures=[_capture(1, step_ids=[1, 2, 3], rid="r0", trigger="rid"),
                                            _capture(7, state="running", step_ids=[4])], waterfall={"wall_ms": 20.0, "own_steps_ms": {"draft": 2.0, "verify_attn": 6.0},
                                               "own_steps_total_ms": 8.0, "others_prefill_ms": 4.0,
                                               "other_decode_ms": 5.0, "batch_sharing_ms": 3.0, "host_gaps_ms": 1.5,
                                               "unaccounted_ms": 1.5})
    from sglang_ctxprof.aggregate.ledger import ledger

    def pt(ctx, spec):  # the ledger's input shape: a speculative and a plain step at one context
        if spec:
            ph = {"draft": 3.0, "verify": 9.0 + ctx / 1e3, "verify_attn": 1.0 + ctx / 1e3, "verify_moe": 5.0,
                  "draft_extend": 1.0, "overhead": 0.7}
            return {"ctx": ctx, "label": str(ctx), "al": 3.0, "phases": {**ph, "step": 13.7 + ctx / 1e3}}
        ph = {"decode": 6.5 + 0.2 * ctx / 1e3, "decode_attn": 0.5 + 0.2 * ctx / 1e3, "decode_moe": 4.0, "overhead": 0.5}
        return {"ctx": ctx, "label": str(ctx), "al": 1.0, "phases": {**ph, "step": 7.0 + 0.2 * ctx / 1e3}}

    led = dict(ledger([pt(c, True) for c in (1000, 16000, 64000)], [pt(c, False) for c in (1000, 16000, 64000)]),
               plain_source="plain reference: contract")
    diag = {"headline": "verify attention grows 1.0 ms per 1k tokens of context", "flags": [
        {"kind": "eager", "message": "no CUDA graph on this CPU run"}], "ledger": led}
    routes = {"": prof, "/status": status, "/requests?slowest=20": {"schema_version": 1, "requests": agg.requests.slowest(20)},
              "/requests/r0": req, "/diagnosis": diag}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path[len(R):]
            srv.reads[path] += 1
            time.sleep(srv.delay.get(path, 0.0))
            code = 200
            if path.startswith("/ui"):
                name = path[len("/ui/"):] or "index.html"
                body, ctype = ui.read(name), ui.FILES[name]
            elif path in srv.fail:  # a route that answers an error: (status, JSON body)
                code, err = srv.fail[path]
                body, ctype = json.dumps(err).encode(), "application/json"
            else:
                body, ctype = json.dumps(routes[path]).encode(), "application/json"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.diag, srv.routes = diag, routes
    srv.reads, srv.delay = Counter(), {}  # reads per route path; seconds a route waits before answering
    srv.fail = {}  # route path -> (HTTP status, JSON body) it answers instead
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, prof


def test_optional_parts_show_when_present(browser):
    srv, prof = _contract_server()
    try:
        browser.get_log("browser")  # drop what the previous page logged
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        browser.get(base + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        assert browser.execute_script("return document.getElementById('position-panel').hidden") is False
        assert browser.execute_script(CANVAS_INK, "#chart-position") > 1000
        pos = browser.execute_script("return window.ctxprof.charts['position'].data")
        assert pos[0] == [1, 2, 3] and pos[1] == [0.95, 0.8, 0.6]
        assert browser.execute_script("return document.getElementById('diag-headline').textContent") == \
            "verify attention grows 1.0 ms per 1k tokens of context"
        assert "no CUDA graph" in browser.execute_script("return document.getElementById('diag-flags').textContent")
        # the ledger: one row per context, the route's own numbers; the slower-than-plain one marked
        led = browser.execute_script("return window.ctxprof.state.ledger")
        want = srv.diag["ledger"]
        assert led["available"] and [r[0] for r in led["rows"]] == [r["label"] for r in want["rows"]]
        assert [r[4] for r in led["rows"]] == [f"{r['speedup']:.2f}×" for r in want["rows"]]
        assert led["verdict"] == want["verdict"] == browser.execute_script(
            "return document.getElementById('ledger-verdict').textContent")
        cells = browser.execute_script("return [...document.querySelectorAll('#ledger tbody tr')].map("
                                       "r => [...r.cells].map(c => c.textContent))")
        assert cells == led["rows"] and led["notes"][-1].startswith("crossover (speedup < 1): ~")
        slower = browser.execute_script("return [...document.querySelectorAll('#ledger td.slower')].length")
        assert slower == sum(r["speedup"] < 1 for r in want["rows"]) >= 1
        assert "0.64% of step (scheduler thread 12.5 µs/step, drain 3 µs/record)" in browser.execute_script("return document.querySelector('#status tbody').textContent")
        assert "eager" in browser.execute_script("return document.querySelector('#buckets tbody').textContent")
        browser.find_element("css selector", "#slow tbody tr[data-rid='r0']").click()
        _wait(browser, "return !document.getElementById('waterfall').hidden")
        parts = browser.execute_script("return [...document.querySelectorAll('#waterfall div')].map(d => d.textContent)")
        assert parts == ["draft", "verify_attn", "others' prefill", "other decode steps", "host gaps", "unaccounted"]
        flex = browser.execute_script("return [...document.querySelectorAll('#waterfall div')].map(d => +d.style.flexGrow)")
        assert sum(flex) == pytest.approx(20.0)  # the wall time, once: batch sharing is not drawn again
        assert "3.0 ms is batch sharing" in browser.execute_script("return document.getElementById('waterfall').title")
        _page_shows_captures(browser, srv)
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"
                and (e.get("source") != "network" or base in e["message"])]
        assert not logs, logs  # every route answered: no failed load, no JavaScript error
    finally:
        srv.shutdown()


def test_a_request_that_fails_to_load_clears_the_drill_down_and_a_failed_reset_says_so(browser):
    """A request's read that fails (the server hangs up, or answers no JSON) says so in the drill-down
    and leaves no other request's steps under it; a reset that cannot reach the server says so.
    Neither is an uncaught error in the page."""
    srv, _ = _contract_server()
    try:
        browser.get_log("browser")
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        browser.get(base + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        browser.find_element("css selector", "#slow tbody tr[data-rid='r0']").click()
        _wait(browser, "return document.querySelectorAll('#steps tbody tr').length > 0")
        del srv.routes["/requests/r0"]  # the handler fails: the connection closes with no answer
        browser.find_element("css selector", "#slow tbody tr[data-rid='r0']").click()
        head = _wait(browser, "const t = document.getElementById('detail-head').textContent;"
                              "return t.startsWith('could not load') ? t : null")
        assert head and browser.execute_script("return document.querySelectorAll('#steps tbody tr').length") == 0
        assert browser.execute_script("return document.getElementById('waterfall').hidden") is True
        srv.shutdown()
        srv.server_close()  # nobody answers now: the connection is refused
        browser.find_element("css selector", "#reset").click()
        _wait(browser, "return document.getElementById('msg').textContent.startsWith('reset failed')")
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]
        assert not logs, logs  # no uncaught error in the page
    finally:
        srv.shutdown()


def test_a_failed_read_says_so_where_its_table_was_and_an_untimed_cost_is_no_zero(browser):
    """A ``/requests`` or ``/status`` read that answers an error says so in its table (never "no
    finished requests yet", nor an old status table that still reads "degraded: none"); a rank that
    has timed no step shows no cost share, not 0%."""
    srv, _ = _contract_server()
    try:
        browser.get_log("browser")
        browser.get(f"http://127.0.0.1:{srv.server_address[1]}" + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        cost = srv.routes["/status"]["ranks"][0]["status"]["cost"]
        cost.update(sampled_steps=0, step_share=None, drain_share=None, total_share=None)
        browser.execute_script("window.ctxprof.refresh()")
        _wait(browser, "return document.querySelector('#status tbody').textContent.includes('no step timed yet')")
        srv.fail.update({"/requests?slowest=20": (500, {"error": "boom"}), "/status": (503, {"error": "off"})})
        n = browser.execute_script("return window.ctxprof.state.refreshes")
        browser.execute_script("window.ctxprof.refresh()")
        _wait(browser, f"return window.ctxprof.state.refreshes > {n}")
        slow = browser.execute_script("return document.querySelector('#slow tbody').textContent")
        status = browser.execute_script("return document.querySelector('#status tbody').textContent")
        assert slow == "could not load /requests: HTTP 500: boom" and status == "could not load /status: HTTP 503: off"
    finally:
        srv.shutdown()


def test_a_slow_server_gets_one_refresh_at_a_time(browser):
    """While a read is still waiting, the page's 3 s ticks start no new refresh: a slow server is not
    sent a pile of reads that the browser holds back and lets go at once when it recovers."""
    srv, _ = _contract_server()
    try:
        browser.get(f"http://127.0.0.1:{srv.server_address[1]}" + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        n = browser.execute_script("return window.ctxprof.state.refreshes")
        srv.delay[""] = 10.0
        srv.reads.clear()
        time.sleep(9.5)  # three of the page's ticks
        assert srv.reads[""] <= 1, srv.reads
        srv.delay.clear()
        _wait(browser, f"return window.ctxprof.state.refreshes > {n}")  # and it goes on when the server answers
    finally:
        srv.shutdown()


def test_the_page_reads_in_a_browser_without_abort_signal_timeout(browser):
    """``AbortSignal.timeout`` came in Chrome 103, Firefox 100 and Safari 16: without it the page's
    reads still run (their 30 s limit by an ``AbortController`` of their own)."""
    srv, _ = _contract_server()
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "delete AbortSignal.timeout;"})
    try:
        browser.get(f"http://127.0.0.1:{srv.server_address[1]}" + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        assert browser.execute_script("return [AbortSignal.timeout, window.ctxprof.state.lastError]") == [None, None]
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})
        srv.shutdown()


def test_the_drill_down_shows_the_request_clicked_last(browser):
    """A request clicked while an earlier one's read is still waiting: the late answer of the first
    does not replace the second under its name."""
    srv, _ = _contract_server()
    try:
        srv.routes["/requests/r1"] = dict(srv.routes["/requests/r0"], rid="r1", prompt_tokens=111)
        browser.get(f"http://127.0.0.1:{srv.server_address[1]}" + names.ROUTE_UI)
        _wait(browser, "return window.ctxprof && window.ctxprof.state.refreshes >= 1")
        srv.delay["/requests/r0"] = 3.0
        browser.find_element("css selector", "#slow tbody tr[data-rid='r0']").click()
        browser.execute_script("document.querySelector('#slow tbody').insertAdjacentHTML('beforeend', "
                               "'<tr data-rid=\"r1\"><td>r1</td></tr>');"
                               "document.querySelector('#slow tbody tr[data-rid=r1]').click();")
        _wait(browser, "return document.getElementById('detail-rid').textContent === 'r1'")
        time.sleep(4.0)  # r0's answer has come by now
        assert browser.execute_script("return [document.getElementById('detail-rid').textContent, "
                                      "window.ctxprof.state.rid]") == ["r1", "r1"]
        assert browser.execute_script("return document.getElementById('detail-head').textContent").startswith(
            "prompt 111 tokens")
    finally:
        srv.shutdown()


def _page_shows_captures(browser, srv) -> None:
    """The request's deep captures in its drill-down, the newest five kept ones in their own section
    (deleted ones left out, as the diagnosis flag does), timeline links only to finished ones, and the
    empty state saying how to ask for one."""
    timeline = names.ROUTE_CAPTURE + "/cap-{}?format=timeline"
    caps = browser.execute_script("return window.ctxprof.state.captures")
    assert [c["id"] for c in caps["recent"]] == ["cap-6", "cap-4", "cap-3", "cap-2", "cap-1"]
    assert [c["state"] for c in caps["recent"]] == ["done", "done", "failed", "done", "done"]
    assert [c["timeline"] for c in caps["recent"]] == [timeline.format(i) if i != 3 else None for i in (6, 4, 3, 2, 1)]
    assert caps["recent"][0]["steps"] == "steps 60-61" and not caps["empty"]
    rows = browser.execute_script("return [...document.querySelectorAll('#captures tbody tr')].map(r => r.dataset.capture)")
    assert rows == [c["id"] for c in caps["recent"]]
    links = browser.execute_script("return [...document.querySelectorAll('#captures tbody a.timeline')].map(a => a.getAttribute('href'))")
    assert links == [c["timeline"] for c in caps["recent"] if c["timeline"]]
    text = browser.execute_script("return document.getElementById('captures-box').textContent")
    assert "no trace written" in text and "slow_step" in text and "read route" in text
    assert browser.execute_script("return document.getElementById('captures-empty').hidden") is True
    # the drill-down of r0 (opened by the caller): its two captures, the steps of it they cover
    req = _wait(browser, "return window.ctxprof.state.requestCaptures")
    assert [(c["id"], c["trigger"], c["steps"], c["mine"], c["state"], c["timeline"]) for c in req] == [
        ("cap-1", "rid", "steps 1-3", 3, "done", timeline.format(1)), ("cap-7", "manual", "step 4", 1, "running", None)]
    cells = browser.execute_script("return [...document.querySelectorAll('#detail-captures tbody tr')].map("
                                   "r => [...r.cells].map(c => c.textContent))")
    assert [c[:4] for c in cells] == [["cap-1", "rid", "steps 1-3 (3 of this request)", "done"],
                                      ["cap-7", "manual", "step 4 (1 of this request)", "running"]]
    assert browser.execute_script("return document.querySelector('#detail-captures a.timeline').getAttribute('href')") == timeline.format(1)
    assert browser.execute_script("return document.querySelectorAll('#steps tbody tr.captured').length") == 4
    # and back: a capture's request opens that request's drill-down
    assert [c["rid"] for c in caps["recent"]] == [None, None, None, "r0", None]
    browser.find_element("id", "detail-close").click()
    browser.find_element("css selector", "#captures tbody a[data-rid='r0']").click()
    _wait(browser, "return !document.getElementById('detail').hidden && "
                   "document.getElementById('detail-rid').textContent === 'r0'")
    # no capture kept: the section says so, and how to ask for one
    srv.routes["/status"]["ranks"][0]["status"]["capture"]["captures"] = []
    n = browser.execute_script("return window.ctxprof.state.refreshes")
    browser.execute_script("window.ctxprof.refresh()")
    _wait(browser, f"return window.ctxprof.state.refreshes > {n}")
    assert browser.execute_script("return window.ctxprof.state.captures") == {"recent": [], "empty": True,
                                                                              "triggers": caps["triggers"]}
    empty = browser.execute_script("const e = document.getElementById('captures-empty'); return !e.hidden && e.textContent")
    assert empty and empty.startswith("none yet") and "POST /ctx_profile/capture?steps=N" in empty and "admin key" in empty
    assert browser.execute_script("return document.querySelectorAll('#captures tbody tr').length") == 0
