#!/usr/bin/env bash
# A custom speculative algorithm loaded by a user plugin - the DDTree case: a draft tree built
# from a block-diffusion drafter.  The user's plugin registers it with
# SpeculativeAlgorithm.register(ALG, ...) through the `sglang.srt.plugins` entry point (installed
# in the same environment), and the algorithm name is passed like a built-in one.
#
# What ctxprof reports for an algorithm it does not know: step span, context buckets, acceptance,
# verify with its attention/MoE split (generic hooks), and the rest as `unattributed`.  For full
# phase records the worker declares its phases:
#     import sglang_ctxprof
#     with sglang_ctxprof.phase("draft"): ...          # also "verify", "draft_extend"
# (a no-op when profiling is off).  tests/plugins/toy_ddtree is a working example (ALG=TOY_DDTREE);
# tests/plugins/toy_ddtree_block is one on the DFLASH block drafter, with its own tree step
# (ALG=TOY_DDTREE_BLOCK, a DFlash drafter as DRAFT).
#
#   ALG=DDTREE DRAFT=org/block-diffusion-drafter launch/dflash-ddtree.sh [extra sglang args]
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen3-8B}"
DRAFT="${DRAFT:-z-lab/Qwen3-8B-DFlash-b16}"
ALG="${ALG:-DDTREE}"   # the name your plugin registers (DFLASH = the built-in block-diffusion drafter)
ARGS=(--model-path "$MODEL" --tp-size "${TP:-1}"
      --speculative-algorithm "$ALG" --speculative-draft-model-path "$DRAFT"
      --mem-fraction-static 0.8
      --host 0.0.0.0 --port "${PORT:-30000}")
# custom (plugin) algorithms without overlap support need the synchronous scheduler
[[ "${NO_OVERLAP:-0}" == 1 ]] && ARGS+=(--disable-overlap-schedule)
source "$(dirname "$0")/_common.sh"
