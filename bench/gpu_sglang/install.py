#!/usr/bin/env python3
"""Unpack the GPU bundle (``bench/gpu_sglang/.bundle/out``) into a site folder; no network, no pip.

    python3 bench/gpu_sglang/install.py [--bundle DIR] [--work /tmp/ctxprof-gpu] [--twins DIR]

* ``sglang.tar.xz`` and ``sgl_kernel.tar.xz`` (stripped by build.py) and every wheel of ``wheels/`` are
  unpacked into ``WORK/site`` (wheels are zip files: the same as ``pip install --no-deps --target``,
  without pip's tag check, so the cp312 files land as they are);
* ``--twins DIR``: for the Python 3.11 rehearsal, a compiled cp312 wheel is replaced by its cp311 twin
  from DIR (same name and version);
* a ``sglang_ctxprof-0.1.0.dist-info`` with the ``sglang.srt.plugins`` entry point goes into the site
  folder, so SGLang loads the plugin from the checkout (the repo root on PYTHONPATH);
* ``model.tar.xz`` (the tiny DeepSeek-V3 + EAGLE draft) into ``WORK/model``.

Prints one line per step and the PYTHONPATH to use (site, bench/gpu_sglang/stubs, the repo root).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def log(msg: str) -> None:
    print(f"[install {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def dist_key(wheel_name: str) -> tuple[str, str]:
    name, ver = wheel_name.split("-")[:2]
    return re.sub(r"[-_.]+", "_", name).lower(), ver


def untar_xz(src: Path, dest: Path) -> None:
    with lzma.open(src) as xz, tarfile.open(fileobj=xz) as tar:
        tar.extractall(dest)


# Source edits applied after unpacking: (file under site, exact text, replacement).  SGLang 0.5.16's
# EAGLE draft-graph capture imports dsa_backend just to list graph-capable backends, and that module
# imports deep_gemm (not carried) under is_cuda(); a stub deep_gemm would instead make SGLang's own
# availability check believe DeepGEMM is there.  The first H200 run died on exactly this import.
SOURCE_EDITS = (
    ("sglang/srt/layers/attention/dsa_backend.py", "if is_cuda():\n    import deep_gemm\n",
     "if is_cuda():\n    try:\n        import deep_gemm\n    except ImportError:  # ctxprof GPU bundle: not carried\n"
     "        deep_gemm = None\n"),
)


def apply_source_edits(site: Path) -> int:
    done = 0
    for rel, old, new in SOURCE_EDITS:
        path = site / rel
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"install: cannot apply the source edit to {rel}: text not found")
        path.write_text(text.replace(old, new, 1))
        done += 1
    log(f"applied {done} source edit(s)")
    return done


def write_plugin_dist_info(site: Path) -> Path:
    d = site / "sglang_ctxprof-0.1.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-ctxprof\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text("[sglang.srt.plugins]\nctxprof = sglang_ctxprof.plugin:register\n")
    return d


def install(bundle: Path, work: Path, twins: Path | None = None, model: bool = True) -> dict:
    t0 = time.time()
    site = work / "site"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for name in ("sglang.tar.xz", "sgl_kernel.tar.xz"):
        untar_xz(bundle / name, site)
        log(f"unpacked {name}")
    twin_map = {}
    if twins is not None:
        twin_map = {dist_key(p.name): p for p in twins.glob("*.whl")}
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    used = []
    for w in wheels:
        src = w
        if twins is not None and re.search(r"-cp3\d+-(cp3\d+|abi3)-", w.name):
            src = twin_map.get(dist_key(w.name))
            if src is None:
                raise SystemExit(f"no cp311 twin for {w.name} in {twins}")
        with zipfile.ZipFile(src) as z:
            z.extractall(site)
        used.append(src.name)
    log(f"unpacked {len(wheels)} wheels" + (" (cp311 twins for compiled ones)" if twins else ""))
    apply_source_edits(site)
    write_plugin_dist_info(site)
    if model and (bundle / "model.tar.xz").exists():
        mdir = work / "model"
        if mdir.exists():
            shutil.rmtree(mdir)
        mdir.mkdir(parents=True)
        untar_xz(bundle / "model.tar.xz", mdir)
        log(f"unpacked the tiny model into {mdir}")
    info = {"site": str(site), "model": str(work / "model" / "dsv3-eagle"), "wheels": used,
            "pythonpath": os.pathsep.join([str(site), str(HERE / "stubs"), str(ROOT)]),
            "install_s": round(time.time() - t0, 1), "manifest_deps": manifest.get("deps")}
    (work / "install.json").write_text(json.dumps(info, indent=1))
    log(f"done in {info['install_s']} s; PYTHONPATH={info['pythonpath']}")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=str(HERE / ".bundle" / "out"))
    ap.add_argument("--work", default=os.environ.get("CTXPROF_GPU_WORK", "/tmp/ctxprof-gpu"))
    ap.add_argument("--twins", default=None, help="folder of cp311 twins of the compiled wheels (rehearsal)")
    ap.add_argument("--no-model", action="store_true")
    args = ap.parse_args(argv)
    install(Path(args.bundle), Path(args.work), Path(args.twins) if args.twins else None, not args.no_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
