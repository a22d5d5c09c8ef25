#!/usr/bin/env python3
"""Rehearsal on a CPU host: import the server with the bundle as if CUDA were there (an sm90 device).

    bench/gpu_sglang/.rehearse/venv/bin/python bench/gpu_sglang/rehearse_cuda_imports.py SITE

(SITE: an ``install.py --twins`` site folder.)  It re-executes itself with PYTHONPATH = SITE, the stubs
and the repo root, ``SGLANG_IS_FLASHINFER_AVAILABLE=false``, and a do-nothing ``libcuda.so.1`` (built
with gcc) on LD_LIBRARY_PATH; then, with lazy symbol binding, patches ``torch.cuda`` to report one
H200 (9.0), imports the modules SGLang's CUDA path imports at module level (``runner.IMPORTS`` plus the
graph runners and MoE top-k), checks that flashinfer's ``fused_topk_deepseek`` stayed None (the
strict stub), and resolves the runner's GPU server arguments with SGLang's own ``prepare_server_args``.
One line per module; exit 1 on any failure.  This is how the missing deps and stubs were found; the
CPU rehearsal (``CPU=1``) cannot reach CUDA branches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXTRA = ["sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner", "sglang.srt.layers.moe.topk",
         # imported lazily by EAGLE's draft-graph capture (the first GPU run died on deep_gemm there)
         "sglang.srt.layers.attention.dsa_backend", "sglang.srt.layers.attention.deepseek_v4_backend",
         "sglang.srt.layers.attention.flashmla_backend",
         "sglang.srt.layers.moe.fused_moe_triton.layer", "sglang.launch_server"]


def fake_cuda() -> None:
    import torch

    props = types.SimpleNamespace(major=9, minor=0, name="NVIDIA H200", total_memory=140 * 2**30,
                                  multi_processor_count=132, L2_cache_size=60 * 2**20, gcnArchName="")
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda d=None: (9, 0)
    torch.cuda.get_device_name = lambda d=None: "NVIDIA H200"
    torch.cuda.get_device_properties = lambda d=None: props
    torch.cuda.mem_get_info = lambda d=None: (130 * 2**30, 140 * 2**30)


def inner() -> int:
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
    fake_cuda()
    import importlib

    sys.path.insert(0, str(HERE))
    import runner

    failed = 0
    for m in runner.IMPORTS + EXTRA:
        try:
            importlib.import_module(m)
            print(f"ok   {m}", flush=True)
        except BaseException as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {m}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", flush=True)
    if not failed:
        import sglang.srt.layers.moe.topk as topk
        ok = topk.fused_topk_deepseek is None
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} flashinfer's fused_topk_deepseek is {topk.fused_topk_deepseek!r} (want None)")
        from sglang.srt.server_args import prepare_server_args

        for graphs in (True, False):
            model = Path(os.environ["CTXPROF_GPU_WORK"]) / "model" / "dsv3-eagle"
            args = [a for a in runner.server_args(str(model), graphs) if a != "--enable-ctx-profile"]
            try:
                sa = prepare_server_args(args)
                print(f"ok   server args (graphs={graphs}): attention {sa.attention_backend}, draft "
                      f"{sa.speculative_draft_attention_backend}, moe {sa.moe_runner_backend}, sampling "
                      f"{sa.sampling_backend}, overlap {not sa.disable_overlap_schedule}, decode graph "
                      f"{sa.cuda_graph_config.decode.backend} bs {sa.cuda_graph_config.decode.bs}")
            except BaseException as exc:  # noqa: BLE001
                failed += 1
                print(f"FAIL server args (graphs={graphs}): {type(exc).__name__}: {exc}")
    print(f"{'PASS' if not failed else 'FAIL'} ({failed} failed)")
    return 1 if failed else 0


def main() -> int:
    if os.environ.get("_CTXPROF_FAKE_CUDA_INNER") == "1":
        return inner()
    site = Path(sys.argv[1]).resolve()
    lib = Path(tempfile.mkdtemp(prefix="fake-libcuda-"))
    (lib / "f.c").write_text("void ctxprof_fake_libcuda(void) {}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib / "libcuda.so.1"),
                    str(lib / "f.c")], check=True)
    env = {**os.environ, "_CTXPROF_FAKE_CUDA_INNER": "1", "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
           "LD_LIBRARY_PATH": str(lib), "CTXPROF_GPU_WORK": str(site.parent),
           "PYTHONPATH": os.pathsep.join([str(site), str(HERE / "stubs"), str(ROOT)])}
    return subprocess.run([sys.executable, __file__], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
