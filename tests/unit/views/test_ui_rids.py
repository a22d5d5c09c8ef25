"""The live page opens any rid the routes show: the URL it asks for, as a browser's URL parser (the
WHATWG one, here Node's) sends it, reaches ``/ctx_profile/requests`` with that rid.

A browser takes a path segment of ``.`` or ``..`` (also written ``%2E``) as a dot segment and drops
it, so such a rid cannot go in the path; the page asks ``/requests?rid=`` for it, and for a rid
holding ``..`` (a shortened long rid), which a forwarder that refuses ``..`` in a path would refuse.
Skipped without ``node`` (failed in CI, ``CI=true``, which installs it); tests/server/test_ui.py
clicks a rid in a real browser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from sglang_ctxprof.model import names
from sglang_ctxprof.model.guard import Guard
from sglang_ctxprof.model.rids import short_rid
from sglang_ctxprof.views import http, http_gate, http_guard, ui

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

NODE = shutil.which("node")
# SGLang takes any string as a rid: the page must reach each one the routes show
RIDS = [".", "..", "...", "a..b", "r0", "x.y", short_rid("L" * 300), "-_:.9", "user@1", "a/b", "b64+/==", "é ü",
        "<script>", "50%", "q?x=1#y", short_rid("@" * 300)]


def _page_urls(rids: list[str]) -> list[str]:
    """The path and query each rid's detail read goes to, as Node's URL parser resolves it."""
    js = ui.read("app.js").decode()
    body = js[js.index("async function openRequest(rid)"):]
    arg = re.search(r"await getJSON\((.*)\);", body).group(1)  # what openRequest asks for
    helpers = "\n".join(re.findall(r"^ *const (?:plainRid|requestPath) = .*$", js, re.M))
    code = (f'const BASE = "{names.ROUTE}";\n{helpers}\nconst out = JSON.parse(process.argv[1]).map((rid) => {{\n'
            f'  const u = new URL(BASE + {arg}, "http://127.0.0.1:1/"); return u.pathname + u.search; }});\n'
            "console.log(JSON.stringify(out));")
    run = subprocess.run([NODE, "-e", code, json.dumps(rids)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def test_the_page_reaches_every_rid_it_shows(monkeypatch):
    if NODE is None:  # CI installs it (.ci/run): there a missing node fails the test
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("needs node (a WHATWG URL parser)")
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    monkeypatch.setattr(http_gate, "_GATE", http_gate.ReadGate(1.0))
    asked = []

    class Ranks:
        async def ask(self, cmd: str, **args):
            asked.append(args.get("rid"))
            return [{"requests": [{"rid": args.get("rid"), "steps": 0}]}]

    app = fastapi.FastAPI()
    http.install_routes(app, Ranks(), admin=lambda f: f)
    c = TestClient(app, raise_server_exceptions=False)
    urls = _page_urls(RIDS)
    for rid, url in zip(RIDS, urls):
        r = c.get(url)
        assert r.status_code == 200 and r.json().get("rid") == rid, (rid, url, r.text)
    assert asked == RIDS
    assert urls[RIDS.index("r0")] == names.ROUTE_REQUESTS + "/r0"  # an ordinary rid: in the path, as before


def test_the_rid_query_and_the_path_agree_and_bad_input_is_a_400(monkeypatch):
    monkeypatch.setattr(http_guard, "_GUARD", Guard(""))
    monkeypatch.setattr(http_guard, "_strikes", 0)
    monkeypatch.setattr(http_gate, "_GATE", http_gate.ReadGate(1.0))

    class Ranks:
        async def ask(self, cmd: str, **args):
            return [{"requests": [{"rid": args["rid"]}] if args.get("rid") == "ab" else []}]

    app = fastapi.FastAPI()
    http.install_routes(app, Ranks(), admin=lambda f: f)
    c = TestClient(app, raise_server_exceptions=False)
    assert c.get(names.ROUTE_REQUESTS + "?rid=ab").json() == c.get(names.ROUTE_REQUESTS + "/ab").json() == {"rid": "ab"}
    r = c.get(names.ROUTE_REQUESTS + "/%2E%2E")  # a client that sends %2E as it is (not a browser)
    assert r.status_code == 404 and "request '..' not found" in r.json()["error"], r.text
    for q, why in (("rid=a%01b", "malformed rid"), ("rid=ab&slowest=3", "not both"), ("rid=", "malformed rid"),
                   ("rid=zz", "not found"), ("rid=a%20b", "not found"), ("rid=" + "x" * 257, "malformed rid"),
                   ("rid=a%C2%85b", "malformed rid"), ("rid=a%C2%9B2J", "malformed rid"),  # C1 controls: NEL, CSI
                   ("rid=a%E2%80%AEb", "malformed rid"), ("rid=a%E2%80%A8b", "malformed rid")):  # bidi, line sep
        r = c.get(f"{names.ROUTE_REQUESTS}?{q}")
        assert r.status_code in (400, 404) and why in r.json()["error"], (q, r.text)


def test_the_cli_asks_for_every_rid_where_the_page_does():
    from sglang_ctxprof.cli.client import request_path

    if NODE is None:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("needs node (a WHATWG URL parser)")
    assert [request_path(r) for r in RIDS] == _page_urls(RIDS)
