#!/usr/bin/env bash
# Kimi-K2 (DeepSeek-V3 architecture: MLA + 384-expert MoE) with an EAGLE-3 draft on one 8-GPU
# node (H200/H20/B200), tensor parallel 8, profiler on.
#
#   launch/kimi-k2-eagle3-tp8.sh [extra sglang args]
#   curl -s localhost:30000/ctx_profile?format=text      # per-phase time by context length
#   curl -s "localhost:30000/ctx_profile?format=prometheus"   # same, Prometheus text (SGLang metrics: /metrics)
#   CTXPROF_OTLP=collector:4317 launch/kimi-k2-eagle3-tp8.sh   # + OTel traces of slow requests
#
# MODEL / DRAFT override the checkpoints.  /ctx_profile answers per DP group (one here) and merges.
set -euo pipefail
MODEL="${MODEL:-moonshotai/Kimi-K2-Instruct-0905}"
DRAFT="${DRAFT:-lmsys/SGLang-EAGLE3-Kimi-K2-Instruct-0905}"
ARGS=(--model-path "$MODEL" --trust-remote-code --tp-size 8
      --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT"
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
      --mem-fraction-static 0.85 --context-length 131072
      --host 0.0.0.0 --port "${PORT:-30000}")
source "$(dirname "$0")/_common.sh"
