#!/usr/bin/env bash
# The GPU run, one command (no network; carry bench/gpu_sglang/.bundle/out):
#   bash bench/gpu_sglang/run.sh OUT
# 1. install.py: unpacks the bundle (SGLang 0.5.16, stripped sgl_kernel, deps, the tiny model) into
#    $CTXPROF_GPU_WORK (default /tmp/ctxprof-gpu);
# 2. runner.py: the stages (imports, server with CUDA graphs, decode checks, diagnosis, A/B, eager
#    server, probe kit), each with its own limit, OUT/results.json rewritten after each.
# Everything is logged to OUT/run.log; server log tails go to OUT/server_logs.txt; the probe kit's
# JSONs are merged into OUT/probes.json.  BUDGET_S (default 470) bounds the runner's stages.
# Rehearsal on a CPU host: REHEARSE=1 (the .rehearse venv, cp311 twins, the CPU shim) with CPU=1
# (real CPU server) or DRY=1 (canned server).
set -u
OUT=${1:?usage: bash bench/gpu_sglang/run.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=${CTXPROF_GPU_WORK:-/tmp/ctxprof-gpu}
export CTXPROF_GPU_WORK=$WORK PYTHONUNBUFFERED=1
INSTALL_ARGS=(--work "$WORK")
EXTRA_PATH=""
if [ "${REHEARSE:-0}" = "1" ]; then
  PY=${PYTHON:-$ROOT/bench/gpu_sglang/.rehearse/venv/bin/python}
  INSTALL_ARGS+=(--twins "$ROOT/bench/gpu_sglang/.rehearse/wheels311")
  # the CPU shim (patches/sglang_cpu) as a plugin: its folder on the path plus a dist-info
  SHIM=$WORK/cpushim
  mkdir -p "$SHIM/sglang_cpu_compat-0.1.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: sglang-cpu-compat\nVersion: 0.1.0\n' > "$SHIM/sglang_cpu_compat-0.1.0.dist-info/METADATA"
  printf '[sglang.srt.plugins]\ncpu_compat = sglang_cpu_compat:register\n' > "$SHIM/sglang_cpu_compat-0.1.0.dist-info/entry_points.txt"
  EXTRA_PATH=":$SHIM:$ROOT/patches/sglang_cpu/src"
fi
{
  echo "== gpu_sglang run.sh $(date -u +%FT%TZ) python=$("$PY" -V 2>&1) ($PY) work=$WORK dry=${DRY:-0} cpu=${CPU:-0}"
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  rc=0
  if [ "${DRY:-0}" != "1" ]; then
    timeout 180 "$PY" bench/gpu_sglang/install.py "${INSTALL_ARGS[@]}" || { echo "== install FAILED"; rc=1; }
  fi
  export PYTHONPATH="$WORK/site:$ROOT/bench/gpu_sglang/stubs:$ROOT$EXTRA_PATH"
  timeout -k 10 "${RUN_TIMEOUT:-560}" "$PY" bench/gpu_sglang/runner.py "$OUT" || rc=$?
  echo "== gpu_sglang run.sh done rc=$rc $(date -u +%FT%TZ)"
  exit $rc
} 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
