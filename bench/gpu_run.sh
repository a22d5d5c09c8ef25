#!/usr/bin/env bash
# The prepared GPU run (one command, about 3-5 minutes on an H200; torch only, no SGLang, no network):
#   bench/gpu_run.sh OUTDIR
# 1. bench/gpu_probe.py: probes P0-P10, each in its own process, JSON in PROBE_DIR (default
#    a new /tmp/ctxprof-probe.*, off OUTDIR: the device tool brings back 8 files at most);
# 2. bench/gpu_check.py: graph vs eager split, replay cost on/off, no synchronize (4 layers);
# 3. bench/gpu_check.py --layers 60 --ctx 1024: the same on a Kimi-K2-deep graph (realistic node count;
#    its ~24 µs blocks run launch-bound eagerly, so graph vs eager is reported there, not held to 5%).
# Everything is logged to OUTDIR/run.log, and every probe's JSON is merged into OUTDIR/probes.json:
# OUTDIR holds 4 files; exit code 0 when all three ran and passed.
# DRY=1 bench/gpu_run.sh OUTDIR runs the same on the simulated device (CPU).
set -u
OUT=${1:?usage: bench/gpu_run.sh OUTDIR}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
DRYFLAG=""
[ "${DRY:-0}" = "1" ] && DRYFLAG="--dry-run"
rc=0
{
  echo "== gpu_run $(date -u +%FT%TZ) python=$($PY -V 2>&1) dry=${DRY:-0}"
  PROBES=${PROBE_DIR:-$(mktemp -d /tmp/ctxprof-probe.XXXXXX)}  # off OUTDIR: 8 files come back at most
  timeout 240 "$PY" bench/gpu_probe.py "$PROBES" $DRYFLAG || rc=1
  "$PY" -c 'import json,pathlib,sys; d=pathlib.Path(sys.argv[1]); json.dump({p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}, open(sys.argv[2], "w"), indent=1)' "$PROBES" "$OUT/probes.json" || rc=1
  timeout 120 "$PY" bench/gpu_check.py $DRYFLAG --out "$OUT/gpu_check.json" || rc=1
  timeout 150 "$PY" bench/gpu_check.py $DRYFLAG --layers 60 --ctx 1024 --steps 20 --eager-report-only \
    --out "$OUT/gpu_check_layers60.json" || rc=1
  echo "== gpu_run done rc=$rc"
  exit $rc
} 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
