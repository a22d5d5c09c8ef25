"""``--tokenizer-worker-num 2``: every HTTP worker serves /ctx_profile.

Those workers import the FastAPI app by the path in ``SGLANG_HTTP_SERVER_APP_PATH`` and run no
plugins; the plugin points it at ``sglang_ctxprof.http_app:app`` (0.5.23 reads the variable;
0.5.20-0.5.22 need the multi-tokenizer-app-path patch).  The control case pins SGLang's own
app: the route is then missing, which is why the setting exists.
"""

from __future__ import annotations

import pytest

from conftest import generate, http, rand_ids, start_server, tiny
from sglang_ctxprof.model import names
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server


@pytest.fixture(scope="module", params=["ctxprof-app", "sglang-app"])
def server(request):
    m = tiny("deepseek-v3", "eagle", high_acceptance=True)
    args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + [
        "--enable-ctx-profile", "--tokenizer-worker-num", "2"]
    env = {names.ENV_SGLANG_APP_PATH: "sglang.srt.entrypoints.http_server:app"} if request.param == "sglang-app" else None
    srv = start_server(f"multi-tokenizer-{request.param}", args, env=env)
    try:
        yield request.param, srv
    finally:
        srv.stop()


def test_route_in_every_worker(server):
    mode, srv = server
    outs = [generate(srv.url, rand_ids(n, seed=n), max_new_tokens=12) for n in (80, 700)]
    codes = [http("GET", srv.url + "/ctx_profile")[0] for _ in range(8)]  # several connections: both workers
    if mode == "sglang-app":
        assert set(codes) == {404}
        return
    assert set(codes) == {200}
    body = http("GET", srv.url + "/ctx_profile")[1]
    steps = sum(b["req_steps"] for b in body["buckets"])
    assert steps == sum(o["meta_info"]["spec_verify_ct"] for o in outs)
