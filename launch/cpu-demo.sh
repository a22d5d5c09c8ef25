#!/usr/bin/env bash
# CPU demo: the tiny DeepSeek-V3 (MLA + MoE, the Kimi-K2 architecture) with an EAGLE-3 draft,
# on this machine's CPU, with the profiler on.  No GPU, no download: the tiny models are built
# locally (sglang-ctxprof tiny-model, ~5 s).  `make demo` runs the same recipe through
# `sglang-ctxprof demo` (which also sends requests and prints the table); this script only
# starts the server so you can drive it yourself:
#
#   launch/cpu-demo.sh                      # serves on 127.0.0.1:30000
#   curl -s localhost:30000/ctx_profile?format=text
#
# Env: MODELS (tiny-model cache, default .cache/models), DRAFT=eagle3|eagle (eagle: identity
# EAGLE head, realistic acceptance ~3.7 of 4), PORT (30000).  Needs the sglang_cpu_compat package
# from patches/sglang_cpu (installed by `make install`); see the reference CPU report.
set -euo pipefail
cd "$(dirname "$0")/.."
export SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
MODELS="${MODELS:-.cache/models}"
DRAFT="${DRAFT:-eagle3}"
PY="${PYTHON:-.venv/bin/python}"
HA=(); SUFFIX=""
if [[ "$DRAFT" == eagle ]]; then HA=(--high-acceptance); SUFFIX="-ha"; fi
OUT="$MODELS/deepseek-v3-$DRAFT$SUFFIX"
CTXPROF_QUIET=1 "$PY" -m sglang_ctxprof.cli.main tiny-model --arch deepseek-v3 --draft "$DRAFT" "${HA[@]}" --out "$OUT" >/dev/null
ALG=EAGLE; [[ "$DRAFT" == eagle3 ]] && ALG=EAGLE3
# The measured CPU recipe (sglang_ctxprof.cli.server.cpu_args): intel_amx is the only CPU
# attention backend with speculative decoding; 0.3 static memory leaves room for the draft.
ARGS=(--model-path "$OUT/target" --device cpu --disable-cuda-graph
      --max-total-tokens 16384 --mem-fraction-static 0.3 --skip-server-warmup
      --attention-backend intel_amx --speculative-algorithm "$ALG"
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
      --speculative-draft-model-path "$OUT/draft-$DRAFT"
      --host 127.0.0.1 --port "${PORT:-30000}")
PYTHON="$PY" source launch/_common.sh
