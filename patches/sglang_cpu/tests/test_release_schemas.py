"""The shim's attention kernels take each release's own argument list.

Each release's schemas are registered in a fresh process (torch registers a schema once per process)
and called there with that release's arguments; the argument counts and the scale/causal positions
are held equal to the call sites in SGLang's intel_amx backend of every cached wheel (`make
fetch-compat`), read by AST without importing it.
"""
import ast
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from sglang_cpu_compat import releases

WHEELS = Path(__file__).resolve().parents[3] / ".cache" / "wheels"
_WHEEL_RE = re.compile(r"sglang-(\d+\.\d+\.\d+)-.*\.whl$")
CACHED = sorted((releases.parse_release(m.group(1)), p) for p in WHEELS.glob("sglang-*.whl")
                if (m := _WHEEL_RE.match(p.name))) if WHEELS.is_dir() else []
BACKEND = "sglang/srt/layers/attention/intel_amx_backend.py"
CALLERS = {"extend_attention_fwd": "extend_attention_cpu", "decode_attention_fwd": "decode_attention_cpu"}

_CALL_WITH_RELEASE_ARGS = textwrap.dedent("""
    import torch, torch.nn.functional as F
    import common_ops
    from sglang_cpu_compat import releases as r
    rel = common_ops.REGISTERED_RELEASE
    args = r.attention_args(rel)
    ops = torch.ops.sgl_kernel
    for op, decls in args.items():
        got = str(getattr(ops, op).default._schema)
        assert got == "sgl_kernel::" + r.schema(op, decls), got
    torch.manual_seed(0)
    H, Hk, D, N, T, P = 4, 2, 16, 64, 9, 5
    E = T - P
    q, k, v = torch.randn(T, H, D), torch.randn(T, Hk, D), torch.randn(T, Hk, D)
    kb, vb = torch.zeros(N, Hk, D), torch.zeros(N, Hk, D)
    slots = torch.randperm(N - 1)[:T] + 1
    r2t = torch.zeros(2, 128, dtype=torch.int32); r2t[1, :T] = slots.int()
    kb[slots], vb[slots] = k, v
    rep = lambda x: x.repeat_interleave(H // Hk, 1).transpose(0, 1)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), rep(k), rep(v), is_causal=True,
                                         scale=D ** -0.5).transpose(0, 1)
    o, od = torch.empty(E, H, D), torch.empty(1, H, D)
    common = dict(k_buffer=kb, v_buffer=vb, k_cache=kb, v_cache=vb, k_scale=1.0, v_scale=1.0, req_to_token=r2t,
                  req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([T]), sm_scale=D ** -0.5,
                  logit_cap=0.0, is_cross=False, window=0, encoder_lens=None, sinks=None)
    ext = dict(common, q_extend=q[P:], k_extend=k[P:], v_extend=v[P:], o_extend=o,
               extend_seq_lens=torch.tensor([E]), extend_start_loc=torch.tensor([0]), max_len_extend=E,
               tree_mask=None, is_causal=True)
    dec = dict(common, query=q[T - 1:], output=od, key=None, value=None, loc=slots[T - 1:],
               attn_logits=torch.empty(0))
    ops.extend_attention_cpu(*[ext[a.split()[-1]] for a in args["extend_attention_cpu"]])
    ops.decode_attention_cpu(*[dec[a.split()[-1]] for a in args["decode_attention_cpu"]])
    assert torch.allclose(o, ref[P:], atol=1e-5), (o - ref[P:]).abs().max()
    assert torch.allclose(od, ref[T - 1:], atol=1e-5), (od - ref[T - 1:]).abs().max()
    print("registered", ".".join(map(str, rel)), len(args["extend_attention_cpu"]),
          len(args["decode_attention_cpu"]))
""")


@pytest.mark.parametrize("release,extend_n,decode_n", [("0.5.13", 18, 17), ("0.5.16", 19, 17), ("0.5.19", 20, 17), ("0.5.23", 22, 19)])
def test_each_release_schema_registers_and_attends(release, extend_n, decode_n):
    env = dict(os.environ, **{releases.RELEASE_ENV: release, "OMP_NUM_THREADS": "1"})
    out = subprocess.run([sys.executable, "-c", _CALL_WITH_RELEASE_ARGS], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["registered", release, str(extend_n), str(decode_n)]


def test_installed_release_comes_from_metadata_and_the_override(monkeypatch):
    from importlib import metadata

    monkeypatch.delenv(releases.RELEASE_ENV, raising=False)
    assert releases.installed_release() == releases.parse_release(metadata.version("sglang"))
    monkeypatch.setenv(releases.RELEASE_ENV, "0.5.17.post1")
    assert releases.installed_release() == (0, 5, 17)
    with pytest.raises(ValueError, match="not an SGLang release"):
        releases.parse_release("latest")


def _backend_calls(wheel: Path) -> dict[str, list[ast.Call]]:
    with zipfile.ZipFile(wheel) as zf:
        tree = ast.parse(zf.read(BACKEND).decode())
    calls = {op: [] for op in CALLERS.values()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLERS:
            calls[CALLERS[node.func.attr]].append(node)
    return calls


@pytest.mark.skipif(not CACHED, reason="no wheels cached: run `make fetch-compat` (network)")
def test_schemas_match_every_cached_release_call_site():
    checked = []
    for release, wheel in CACHED:
        if release < (0, 5, 13):
            continue
        args = releases.attention_args(release)
        for op, calls in _backend_calls(wheel).items():
            assert calls, f"{wheel.name}: no call of {op}"
            for call in calls:
                assert not call.keywords, f"{wheel.name}: {op} called with keywords"
                assert len(call.args) == len(args[op]), (wheel.name, op, len(call.args), len(args[op]))
                for decl, given in zip(args[op], call.args):
                    name = decl.split()[-1]
                    if name in ("k_scale", "v_scale"):
                        assert "scale" in ast.unparse(given), (wheel.name, op, name, ast.unparse(given))
                    if name == "is_causal":
                        assert "causal" in ast.unparse(given), (wheel.name, op, ast.unparse(given))
        checked.append(release)
    assert (0, 5, 13) in checked and (0, 5, 23) in checked, checked
