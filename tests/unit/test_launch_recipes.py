"""launch/*.sh: every recipe's arguments are parsed by SGLang's own ``prepare_server_args``.

The scripts print their final argument list with ``CTXPROF_PRINT_ARGS=1``; one subprocess loads
SGLang's plugins the way ``sglang.launch_server`` does (ours adds ``--enable-ctx-profile``; the
toy DDTree plugin registers ``TOY_DDTREE`` for dflash-ddtree.sh) and parses each list.  No GPU and
no model download: prepare_server_args only reads arguments.  cpu-demo.sh must also equal the
recipe ``sglang-ctxprof demo`` (``make demo``) uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, write_dist_info

LAUNCH = ROOT / "launch"
TOY = ROOT / "tests" / "plugins" / "toy_ddtree"

# script -> (extra env, expected facts after parsing)
RECIPES = {
    "kimi-k2-eagle3-tp8.sh": ({}, {"speculative_algorithm": "EAGLE3", "tp_size": 8}),
    "deepseek-v3-mtp.sh": ({}, {"speculative_algorithm": "EAGLE", "tp_size": 8, "enable_multi_layer_eagle": False}),
    "deepseek-v3-mtp.sh+multi": ({"MULTI_LAYER": "1"}, {"speculative_algorithm": "EAGLE", "enable_multi_layer_eagle": True}),
    "qwen3-moe-ngram.sh": ({}, {"speculative_algorithm": "NGRAM", "tp_size": 2}),
    "qwen3-moe-ngram.sh+otel": ({"CTXPROF_OTLP": "collector:4317"},
                                {"speculative_algorithm": "NGRAM", "enable_trace": True,
                                 "otlp_traces_endpoint": "collector:4317"}),
    "dflash-ddtree.sh": ({"ALG": "TOY_DDTREE", "NO_OVERLAP": "1"},
                         {"speculative_algorithm": "TOY_DDTREE", "disable_overlap_schedule": True}),
    "cpu-demo.sh": ({}, {"speculative_algorithm": "EAGLE3", "device": "cpu"}),
}

PARSER = r"""
import json, sys
cases = json.load(sys.stdin)
sys.argv = ["sglang.launch_server", "--enable-ctx-profile"]   # what launch_server sees at plugin load
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
out = {}
for name, argv in cases.items():
    try:
        sa = prepare_server_args(argv)
        out[name] = {k: getattr(sa, k, None) for k in ("speculative_algorithm", "tp_size", "device",
                     "enable_metrics", "enable_trace", "otlp_traces_endpoint", "enable_multi_layer_eagle",
                     "disable_overlap_schedule", "_ctx_profile")}
    except BaseException as exc:  # argparse exits on a bad flag
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(out))
"""


def _argv(name: str, env: dict) -> list[str]:
    script = name.split("+")[0]
    res = subprocess.run(["bash", str(LAUNCH / script)], env={**os.environ, **env, "CTXPROF_PRINT_ARGS": "1",
                                                             "PYTHON": sys.executable},
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    sys.path.insert(0, str(TOY))
    try:
        import toy_ddtree
    finally:
        sys.path.remove(str(TOY))
    ep = tmp_path_factory.mktemp("toy-ep")
    write_dist_info(str(ep), toy_ddtree.__name__)
    argvs = {name: _argv(name, env) for name, (env, _) in RECIPES.items()}
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{TOY}:{ep}"}
    res = subprocess.run([sys.executable, "-c", PARSER], input=json.dumps(argvs), env=env,
                         capture_output=True, text=True, timeout=600)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, (res.stdout + res.stderr)[-3000:]
    return argvs, json.loads(line[-1][len("RESULT "):])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_parses_with_sglang(parsed, name):
    argvs, out = parsed
    got = out[name]
    assert "error" not in got, got
    assert "--enable-ctx-profile" in argvs[name]
    assert got["_ctx_profile"] is True  # our flag survived into ServerArgs
    assert got["enable_metrics"] is True
    for k, v in RECIPES[name][1].items():
        assert got[k] == v, (name, k, got[k])


def test_every_script_is_covered_and_documented():
    scripts = {p.name for p in LAUNCH.glob("*.sh") if not p.name.startswith("_")}
    assert scripts == {n.split("+")[0] for n in RECIPES}
    for s in scripts:
        text = (LAUNCH / s).read_text()
        assert text.startswith("#!/usr/bin/env bash\n#") and "_common.sh" in text, s
        assert os.access(LAUNCH / s, os.X_OK), s


def test_bad_extra_flag_is_rejected_by_sglang(parsed):
    # the check is real: SGLang's parser rejects what it does not know
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    code = PARSER.replace("cases = json.load(sys.stdin)", "cases = {'bad': ['--model-path', 'x', '--no-such-flag']}")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    out = json.loads([x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    assert "error" in out["bad"] and "SystemExit" in out["bad"]["error"]


def test_cpu_demo_script_matches_make_demo_recipe(parsed):
    from sglang_ctxprof.cli.server import cpu_args

    argvs, _ = parsed
    argv = argvs["cpu-demo.sh"]
    target = argv[argv.index("--model-path") + 1]
    draft = argv[argv.index("--speculative-draft-model-path") + 1]
    want = cpu_args(target, algorithm="EAGLE3", draft=draft) + ["--enable-ctx-profile"]
    got = [a for a in argv if a not in ("--host", "127.0.0.1", "--port", "30000", "--enable-metrics")]
    assert got == want
