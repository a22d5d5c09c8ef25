"""Profiling never changes what SGLang computes, checked on a context-sensitive model.

The pure-bigram models used elsewhere make greedy outputs insensitive to almost everything; here a
fully random tiny Qwen3-MoE with NGRAM speculative decoding (varying acceptance) is served twice,
with and without ``--enable-ctx-profile``, and must produce identical greedy tokens for prompts of
several lengths sent concurrently (so batches mix).
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from conftest import generate, http, rand_ids, start_server, tiny
from sglang_ctxprof.cli.server import cpu_args

pytestmark = pytest.mark.server

PROMPTS = ((70, 40), (600, 25), (1800, 33))


def _outputs(profile: bool) -> tuple[list[list[int]], list[int]]:
    m = tiny("qwen3-moe")
    args = cpu_args(m["target"], algorithm="NGRAM") + (["--enable-ctx-profile"] if profile else [])
    srv = start_server(f"outputs-{'on' if profile else 'off'}", args, env={"SGLANG_CTX_PROFILE": ""})
    try:
        with cf.ThreadPoolExecutor(3) as ex:
            outs = list(ex.map(lambda p: generate(srv.url, rand_ids(p[0], seed=900 + p[0]), p[1]), PROMPTS))
        route = http("GET", srv.url + "/ctx_profile")[0]
        return [o["output_ids"] for o in outs], [o["meta_info"]["spec_verify_ct"] for o in outs] + [route]
    finally:
        srv.stop()


def test_greedy_outputs_identical_with_and_without_profiling():
    on, on_meta = _outputs(True)
    off, off_meta = _outputs(False)
    assert on_meta[-1] == 200 and off_meta[-1] == 404
    assert all(len(o) == n for o, (_, n) in zip(on, PROMPTS))
    assert on == off
    assert len({tuple(o) for o in on}) == len(on)  # a context-sensitive model: the outputs differ
