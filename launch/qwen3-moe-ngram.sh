#!/usr/bin/env bash
# Qwen3-MoE with NGRAM speculative decoding (no draft model: drafts come from an n-gram trie of
# the prompt and output), profiler on.  Phases: draft (= trie lookup + verify-input build),
# verify (+attention/MoE), draft_extend (= corpus update), overhead.
#
#   launch/qwen3-moe-ngram.sh [extra sglang args];  curl -s localhost:30000/ctx_profile?format=text
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen3-30B-A3B-Instruct-2507}"
ARGS=(--model-path "$MODEL" --tp-size "${TP:-2}"
      --speculative-algorithm NGRAM --speculative-num-draft-tokens 8
      --mem-fraction-static 0.85
      --host 0.0.0.0 --port "${PORT:-30000}")
source "$(dirname "$0")/_common.sh"
