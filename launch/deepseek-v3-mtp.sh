#!/usr/bin/env bash
# DeepSeek-V3/R1 with its own MTP (NextN) layer as the draft, 8 GPUs, profiler on.
# SGLang loads the MTP layer from the same checkpoint (--speculative-algorithm EAGLE with the
# draft path = the model; NEXTN is an alias).  Phases: draft (MTP steps), verify (+attention/MoE),
# draft_extend, overhead.  Set MULTI_LAYER=1 for --enable-multi-layer-eagle (models whose
# checkpoints carry several MTP layers).
#
#   launch/deepseek-v3-mtp.sh [extra sglang args];  curl -s localhost:30000/ctx_profile?format=text
set -euo pipefail
MODEL="${MODEL:-deepseek-ai/DeepSeek-V3-0324}"
ARGS=(--model-path "$MODEL" --trust-remote-code --tp-size "${TP:-8}"
      --speculative-algorithm EAGLE --speculative-draft-model-path "$MODEL"
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
      --mem-fraction-static 0.85
      --host 0.0.0.0 --port "${PORT:-30000}")
[[ "${MULTI_LAYER:-0}" == 1 ]] && ARGS+=(--enable-multi-layer-eagle)
source "$(dirname "$0")/_common.sh"
