"""Auth: ``/ctx_profile`` follows SGLang's own auth levels, on a real CPU server.

The server runs with both ``--api-key`` and ``--admin-api-key``.  SGLang's rules
(``sglang.srt.utils.auth.decide_request_auth``): NORMAL routes need the api key (the admin key is
not accepted for them); ADMIN_OPTIONAL routes need the admin key once one is configured.  Our read
routes are NORMAL and behave exactly like SGLang's ``GET /model_info``; reset/enable/disable are
ADMIN_OPTIONAL and behave exactly like SGLang's ``POST /flush_cache``.  No key or a wrong key: 401.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

import ctxprof_ref
from conftest import LOG_DIR, generate, http, rand_ids
from sglang_ctxprof.model import names
from sglang_ctxprof.cli.server import ServerError, ServerProcess

pytestmark = pytest.mark.server

API_KEY = "user-key-123"
ADMIN_KEY = "admin-key-456"
R = names.ROUTE


class KeyedServer(ServerProcess):
    """ServerProcess whose readiness probe sends the api key."""

    def wait_ready(self, t0: float) -> None:
        while time.time() - t0 < self.timeout:
            if self.proc.poll() is not None:
                raise ServerError(f"SGLang exited with code {self.proc.returncode}{self._tail()}")
            req = urllib.request.Request(self.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()).get("data"):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        raise ServerError(f"SGLang did not become ready{self._tail()}")


@pytest.fixture(scope="module")
def server():
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    args = ctxprof_ref.model_args() + [names.CLI_FLAG, "--api-key", API_KEY, "--admin-api-key", ADMIN_KEY]
    srv = KeyedServer(args, log_path=str(LOG_DIR / "auth.log"), timeout=600)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def bearer(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}


KEYS = {"none": None, "wrong": "nope", "empty": "", "api": API_KEY, "admin": ADMIN_KEY}
READS = [f"{R}", f"{R}?format=text", f"{R}?format=prometheus", f"{R}/status", f"{R}/requests?slowest=5"]
WRITES = [f"{R}/reset", f"{R}/disable", f"{R}/enable"]


@pytest.fixture(scope="module")
def traffic(server):
    out = generate(server.url, rand_ids(128, seed=5), max_new_tokens=10, headers=bearer(API_KEY))
    return out["meta_info"]["id"]


@pytest.mark.parametrize("who", list(KEYS))
def test_reads_need_the_api_key(server, traffic, who):
    expected = 200 if who == "api" else 401
    sglang_own = http("GET", server.url + "/model_info", headers=bearer(KEYS[who]))[0]
    assert sglang_own == expected  # SGLang's own NORMAL route
    for path in READS + [f"{R}/requests/{traffic}"]:
        status, body = http("GET", server.url + path, headers=bearer(KEYS[who]))
        assert status == expected, (who, path, status, body)
        if status == 401:
            assert body == {"error": "Unauthorized"} or "error" in body


@pytest.mark.parametrize("who", list(KEYS))
def test_commands_need_the_admin_key(server, traffic, who):
    expected = 200 if who == "admin" else 401
    sglang_own = http("POST", server.url + "/flush_cache", headers=bearer(KEYS[who]))[0]
    assert sglang_own == expected  # SGLang's own ADMIN_OPTIONAL route
    for path in WRITES:  # ends with enable: profiling stays on
        status, body = http("POST", server.url + path, {}, headers=bearer(KEYS[who]))
        assert status == expected, (who, path, status, body)


def test_rejected_commands_changed_nothing(server, traffic):
    """A 401 reset must not have reset: the request seen before is still in the profile."""
    h = bearer(API_KEY)
    generate(server.url, rand_ids(90, seed=6), max_new_tokens=6, headers=h)
    before = http("GET", server.url + R, headers=h)[1]["totals"]["decode_steps"]
    assert before > 0
    for key in (None, "nope", API_KEY):
        assert http("POST", server.url + f"{R}/reset", {}, headers=bearer(key))[0] == 401
        assert http("POST", server.url + f"{R}/disable", {}, headers=bearer(key))[0] == 401
    body = http("GET", server.url + R, headers=h)[1]
    assert body["totals"]["decode_steps"] == before and body["enabled"] is True


def test_admin_reset_works_and_generation_continues(server, traffic):
    h = bearer(API_KEY)
    assert http("POST", server.url + f"{R}/reset", {}, headers=bearer(ADMIN_KEY))[0] == 200
    assert http("GET", server.url + R, headers=h)[1]["totals"]["decode_steps"] == 0
    out = generate(server.url, rand_ids(70, seed=8), max_new_tokens=7, headers=h)
    assert out["meta_info"]["completion_tokens"] == 7
    assert http("GET", server.url + R, headers=h)[1]["totals"]["decode_steps"] > 0


def test_health_stays_open(server):
    """SGLang leaves /health open for probes; our plugin must not change that."""
    assert http("GET", server.url + "/health")[0] == 200


def test_ui_forwarder_lends_the_key_to_reads_only(server, traffic):
    """``sglang-ctxprof ui --api-key`` on the real server: reads pass with the lent key; a write
    without its own key, another site's Origin or a foreign Host never reach the server."""
    import threading

    from sglang_ctxprof.cli.ui import _forwarder

    fw = _forwarder(server.url, API_KEY, 0)
    threading.Thread(target=fw.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{fw.server_address[1]}"
    try:
        h = bearer(API_KEY)
        steps = http("GET", server.url + R, headers=h)[1]["totals"]["decode_steps"]
        assert steps > 0
        assert http("GET", base + R)[0] == 200
        rid = generate(server.url, rand_ids(50, seed=12), max_new_tokens=4, headers=h)["meta_info"]["id"]
        assert http("GET", base + f"{R}/requests/{rid}")[1]["rid"] == rid
        assert http("GET", base + R, headers={"Origin": "http://evil.example"})[0] == 403
        for route in ("reset", "disable"):
            assert http("POST", base + f"{R}/{route}", {})[0] == 403
            assert http("POST", base + f"{R}/{route}", {}, headers={"Origin": "http://evil.example",
                                                                     "Authorization": f"Bearer {ADMIN_KEY}"})[0] == 403
        body = http("GET", server.url + R, headers=h)[1]
        assert body["enabled"] is True and body["totals"]["decode_steps"] >= steps
    finally:
        fw.shutdown()
