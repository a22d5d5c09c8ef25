#!/usr/bin/env python3
"""Build the GPU bundle: SGLang 0.5.16 + a stripped sglang-kernel + the server's missing deps + a tiny model.

Runs here (network to PyPI).  Everything goes to ``bench/gpu_sglang/.bundle/`` (git-ignored); the folder
to carry to the GPU machine is ``bench/gpu_sglang/.bundle/out``.  Prints the total against the 64 MiB
that may travel.  ``--rehearse`` also fills ``.rehearse/wheels311`` with the cp311 twins of the compiled
deps, for the Python 3.11 rehearsal venv (``.rehearse/venv``).

    python3.11 bench/gpu_sglang/build.py [--model-python .rehearse/venv/bin/python] [--rehearse]

What is stripped (documented in README.md):
* sglang: ``srt/grpc/_core*.so`` and ``srt/multimodal/_core*.so`` (gRPC server, one image processor);
* sglang-kernel: ``flash_ops`` (FA3, 1.1 GB), ``flashmla_ops``, ``infllm_ops``, ``sm100/`` (only the
  H200's ``sm90/common_ops.abi3.so`` and ``spatial_ops`` stay); FA3 is imported lazily by SGLang's FA3
  backend only, flashmla/infllm by their own loaders only;
* no flashinfer at all: the runner writes a stub package (``flashinfer`` imports, every attribute
  raises when called) and sets ``SGLANG_IS_FLASHINFER_AVAILABLE=false``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUNDLE = HERE / ".bundle"
DL = BUNDLE / "dl"
OUT = BUNDLE / "out"
LIMIT = 64 * 2**20

SGLANG = "sglang==0.5.16"
KERNEL = "sglang-kernel==0.4.5"
# The server's (and ctxprof's) packages that the GPU machine's image lacks, with exact versions.  The
# machine has (KINDS.md): aiohttp, anyio, click, h11, httpx, httpcore, requests, rich, tqdm, protobuf,
# typing-extensions, uvloop, prometheus-client, psutil, numpy, torch 2.11.0, triton 3.6.0,
# transformers 5.17.0, ... — those are not carried.
DEPS = [
    "fastapi==0.165.0", "starlette==1.10.0", "annotated-doc==0.0.7", "uvicorn==0.55.0",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "pyzmq==27.3.0", "orjson==3.13.0", "msgspec==0.23.0", "setproctitle==1.3.8", "pybase64==1.5.1",
    "python-multipart==0.0.34", "partial-json-parser==0.2.1.1.post7", "interegular==0.3.3",
    "openai==2.6.1", "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1",
    "structlog==26.1.0", "opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2",
]
# SGLang 0.5.16 pins transformers 5.12.1; with the machine's 5.17 its config registry fails at import
# ("'qwen3_asr' is already used by a Transformers config"); 5.12.1 wants tokenizers<=0.23.0 (the machine: 0.23.2; 0.23.0 has no wheel).
# The rest were found by importing the server with CUDA faked on (rehearse.py): imported at module level.
EXTRA_DEPS: list[str] = ["transformers==5.12.1", "tokenizers==0.22.2", "dill==0.4.1", "compressed-tensors==0.20.1",
                         "loguru==0.7.3", "gguf==0.19.0", "jsonschema==4.26.0", "referencing==0.37.0",
                         "rpds-py==2026.9.1", "jsonschema-specifications==2025.9.1",
                         # sglang.jit_kernel (tvm-ffi + the machine's nvcc) serves a few CUDA ops with no AOT
                         # twin, e.g. the MLA KV write at >= 768 rows (kernels/ops/kvcache/mla_buffer.py)
                         "apache-tvm-ffi==0.1.11"]

PLAT312 = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none"]
PLAT311 = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
           "--abi", "none"]
PLATFORMS = [a for p in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                         "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "any")
             for a in ("--platform", p)]

KERNEL_DROP = ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops",
               "sgl_kernel/sm100/")
SGLANG_DROP = ("sglang/srt/grpc/_core", "sglang/srt/multimodal/_core")


def log(msg: str) -> None:
    print(f"[build] {msg}", flush=True)


def pip_download(specs: list[str], dest: Path, plat: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *plat, *PLATFORMS,
           "-d", str(dest), *specs]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def wheel_for(dest: Path, spec: str, other: str = "-cp311-") -> Path:
    name, ver = spec.split("==")
    norm = name.replace("-", "_").lower()
    hits = [p for p in dest.glob("*.whl")
            if p.name.lower().startswith(f"{norm}-{ver}-".lower()) and other not in p.name]
    if len(hits) != 1:
        raise SystemExit(f"expected one wheel for {spec} in {dest}, found {[h.name for h in hits]}")
    return hits[0]


def tar_xz(src_root: Path, members: list[str], out: Path, preset: int = 9) -> None:
    with lzma.open(out, "wb", preset=preset) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for m in members:
            tar.add(str(src_root / m), arcname=m)


def strip_wheel_to_tar(whl: Path, drop: tuple[str, ...], out: Path, work: Path) -> dict:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    kept = dropped = 0
    dropped_names = []
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            n = info.filename
            if any(n.startswith(d) for d in drop) or "/__pycache__/" in n:
                dropped += info.file_size
                dropped_names.append(n)
                continue
            z.extract(info, work)
            kept += info.file_size
    tops = sorted(os.listdir(work))
    tar_xz(work, tops, out)
    return {"wheel": whl.name, "kept_bytes": kept, "dropped_bytes": dropped,
            "dropped": dropped_names, "xz_bytes": out.stat().st_size}


def build_model(python: str, out: Path) -> dict:
    """The tiny DeepSeek-V3 (MLA + MoE) with its identity EAGLE head, built with ``python``'s transformers."""
    mdir = BUNDLE / "model"
    if mdir.exists():
        shutil.rmtree(mdir)
    cmd = [python, "-m", "sglang_ctxprof.cli.main", "tiny-model", "--arch", "deepseek-v3", "--draft", "eagle",
           "--high-acceptance", "--out", str(mdir / "dsv3-eagle")]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "CTXPROF_QUIET": "1",
                                                  "PYTHONPATH": str(ROOT)})
    tar_xz(mdir, ["dsv3-eagle"], out, preset=6)
    return {"xz_bytes": out.stat().st_size, "built_with": python}


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-python", default=str(HERE / ".rehearse/venv/bin/python"),
                    help="a Python with torch + transformers to build the tiny model (default: the rehearsal venv)")
    ap.add_argument("--rehearse", action="store_true", help="also download the cp311 twins for the rehearsal")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--rebuild-model", action="store_true", help="rebuild model.tar.xz even if it is there")
    args = ap.parse_args(argv)
    model_meta = BUNDLE / "model.meta.json"
    needs_model = not args.skip_model and (args.rebuild_model or not (OUT / "model.tar.xz").exists()
                                           or not model_meta.exists())
    if needs_model and not Path(args.model_python).exists():  # before ~400 MB of downloads
        print(f"build.py: no {args.model_python}: make the rehearsal venv (README, Rehearsal) or pass "
              "--model-python PY (a Python with torch and transformers)", file=sys.stderr)
        return 2

    OUT.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"sglang": SGLANG, "sglang_kernel": KERNEL, "deps": DEPS + EXTRA_DEPS}

    log(f"downloading {SGLANG} (cp312) and {KERNEL} (383 MB, once)")
    pip_download([SGLANG, KERNEL], DL, PLAT312)
    for key, spec, drop, name in (("sglang_tar", SGLANG, SGLANG_DROP, "sglang"),
                                  ("kernel_tar", KERNEL, KERNEL_DROP, "sgl_kernel")):
        out, meta = OUT / f"{name}.tar.xz", BUNDLE / f"{name}.meta.json"
        whl = wheel_for(DL, spec)
        if out.exists() and meta.exists() and json.loads(meta.read_text()).get("wheel") == whl.name:
            log(f"{out.name}: up to date")
        else:
            log(f"stripping {whl.name} (xz -9, about 2 min)")
            meta.write_text(json.dumps(strip_wheel_to_tar(whl, drop, out, BUNDLE / f"work-{name}")))
        manifest[key] = json.loads(meta.read_text())

    deps = DEPS + EXTRA_DEPS
    log(f"downloading {len(deps)} dependency wheels (cp312)")
    wdir = OUT / "wheels"
    if wdir.exists():
        shutil.rmtree(wdir)
    pip_download(deps, BUNDLE / "dl312", PLAT312)
    wdir.mkdir()
    for spec in deps:
        w = wheel_for(BUNDLE / "dl312", spec)
        shutil.copy2(w, wdir / w.name)
    if args.rehearse:
        log("downloading the cp311 twins of compiled deps for the rehearsal")
        w311 = HERE / ".rehearse" / "wheels311"
        if w311.exists():
            shutil.rmtree(w311)
        w311.mkdir(parents=True)
        pip_download(deps, BUNDLE / "dl311", PLAT311)
        for spec in deps:
            w = wheel_for(BUNDLE / "dl311", spec, other="-cp312-")
            shutil.copy2(w, w311 / w.name)

    if needs_model:
        log("building the tiny DeepSeek-V3 + EAGLE draft")
        model_meta.write_text(json.dumps(build_model(args.model_python, OUT / "model.tar.xz")))
    if model_meta.exists():
        manifest["model_tar"] = json.loads(model_meta.read_text())

    files = sorted(p for p in OUT.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest["files"] = {str(p.relative_to(OUT)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                         for p in files}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1))
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    tree = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True).stdout.split(b"\0")
    tree_bytes = sum((ROOT / f.decode()).stat().st_size for f in tree if f and (ROOT / f.decode()).is_file())
    for p in files:
        log(f"  {p.stat().st_size / 2**20:7.2f} MiB  {p.relative_to(OUT)}")
    log(f"bundle {total / 2**20:.2f} MiB + working tree {tree_bytes / 2**20:.2f} MiB = "
        f"{(total + tree_bytes) / 2**20:.2f} MiB of {LIMIT / 2**20:.0f} MiB")
    if total + tree_bytes > LIMIT:
        log("TOO BIG")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
