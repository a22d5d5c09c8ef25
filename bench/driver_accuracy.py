"""Benchmark (not a test): how close is the sweep's client-side two-point decode tok/s to the server's truth?

Runs ``sglang-ctxprof sweep --launch`` on the CPU demo server (tiny DeepSeek-V3 + identity EAGLE
head, ``--enable-ctx-profile``) and, for every (ctx, repeat) point, compares

* two-point tok/s = (n_long - n_short) / (t_long - t_short), measured by the client, with
* server tok/s = committed tokens per step / mean step time, from ``/ctx_profile`` over the same two
  requests (the profile is reset before each point), and
* server pair tok/s = the same difference as the client's, from the server's per-request decode time.

Prints the ratio client / server per point and the median per context.  Goal: within 5 %.  The
client's figure also pays what happens between decode steps (scheduling, detokenization, HTTP) and
the prefill-time noise that the subtraction does not cancel, so a ratio below 1 is expected.

    .venv/bin/python bench/driver_accuracy.py [--ctx 64 1024 3072] [--repeat 3] [--long 264]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ctxprof.cli.server import cpu_args  # noqa: E402
from sglang_ctxprof.cli.sweep import SweepArgs, run_args  # noqa: E402
from sglang_ctxprof.cli.sweep_results import load_run  # noqa: E402
from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, nargs="+", default=[64, 1024, 3072])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=264)
    ap.add_argument("--out", default=str(ROOT / ".cache" / "driver-accuracy"))
    ap.add_argument("--models", default=str(ROOT / ".cache" / "models"))
    ap.add_argument("--json", default=None, help="also write the per-point ratios here")
    ns = ap.parse_args()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("CTXPROF_QUIET", "1")
    paths = build(TinyModelArgs(arch="deepseek-v3", draft="eagle", high_acceptance=True,
                                out=os.path.join(ns.models, "deepseek-v3-eagle-ha")))
    if os.path.isfile(os.path.join(ns.out, "meta.json")):
        shutil.rmtree(ns.out)
    rc = run_args(SweepArgs(launch=True, server_args=cpu_args(paths["target"], algorithm="EAGLE",
                                                              draft=paths["draft"]),
                            ctx=ns.ctx, repeat=ns.repeat, short=ns.short, long=ns.long, out=ns.out, plots=False))
    if rc:
        return rc
    _, points, _ = load_run(ns.out)
    rows = []
    print(f"\n{'ctx':>6} {'rep':>3} {'two-point':>10} {'server':>8} {'ratio':>6} {'srv pair':>9} {'ratio':>6}")
    for p in sorted(points, key=lambda p: (p["ctx"], p["repeat"])):
        tp, srv, pair = p.get("decode_tok_s"), (p.get("breakdown") or {}).get("server_tok_s"), p.get("server_pair_tok_s")
        r1 = tp / srv if tp and srv else None
        r2 = tp / pair if tp and pair else None
        rows.append({"ctx": p["ctx"], "repeat": p["repeat"], "two_point": tp, "server": srv, "ratio": r1,
                     "server_pair": pair, "pair_ratio": r2})
        f = (lambda x, w=8, d=1: f"{x:{w}.{d}f}" if x is not None else " " * (w - 1) + "-")
        print(f"{p['ctx']:>6} {p['repeat']:>3} {f(tp, 10)} {f(srv)} {f(r1, 6, 3)} {f(pair, 9)} {f(r2, 6, 3)}")
    print("\nmedian ratio two-point / server per context:")
    for ctx in sorted({r["ctx"] for r in rows}):
        rs = [r["ratio"] for r in rows if r["ctx"] == ctx and r["ratio"] is not None]
        if rs:
            within = sum(abs(x - 1) <= 0.05 for x in rs)
            print(f"  ctx {ctx:>6}: {statistics.median(rs):.3f}  ({within}/{len(rs)} points within 5%)")
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
