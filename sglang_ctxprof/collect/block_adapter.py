"""The adapter's part for SGLang's block drafters: DFLASH, DSPARK and UNO (``names.BLOCK_ALGORITHMS``).

:mod:`.adapter` merges the tables below into its own (targets, signatures, release limits), so the
hooks and the offline AST check see one adapter.  Nothing here imports SGLang: the targets are dotted
paths, and the readers take SGLang objects as arguments.

Map of one decode step (SGLang 0.5.23; leaf phases still tile the step: time outside the named
phases, the acceptance decision included, is ``overhead``):

* DFLASH ``DFlashWorkerV2.forward_batch_generation``, inline: draft = ``draft_model_runner.forward``
  (one TARGET_VERIFY pass over ``[anchor, mask, ...]``, the block's single denoising step; timed by
  the ``block_forward`` hook on ``ModelRunner.forward``) + the draft sampler
  (``_greedy_sample_from_vocab_parallel_head``, or ``_propose_selector_block``); verify =
  ``target_worker.forward_batch_generation(is_verify=True)``; acceptance = ``_accept_block``
  (inline before 0.5.19); draft_extend = ``_append_target_hidden_to_draft_kv_by_loc`` (target
  hidden states projected into the draft KV).
* DSPARK ``DSparkWorkerV2._forward_decode``: draft = ``DraftBlockProposer.propose`` (draft forward
  + sampler); verify = ``TargetVerifyExecutor.run_(non_)compact`` -> ``is_verify=True``; acceptance
  = ``TargetVerifyExecutor.accept_and_finalize``; draft_extend = ``TargetVerifyExecutor.commit_hidden``.
* UNO ``UnoWorkerV2._forward_decode(_tree)``: draft = ``_run_draft_block`` (the target with a LoRA,
  through ``is_verify=True``: nested in draft, so it is not verify); verify =
  ``_run_target_block`` (UNO_VERIFY); acceptance = ``_accept_and_pack`` / ``run_uno_sampling``;
  no draft KV to extend (the draft pass writes the target's own KV).

The block hooks time decode steps only: the prefill path runs some of the same seams (the prompt's
draft KV).  ``denoise_steps`` counts the model forward passes that proposed the block.
"""

from __future__ import annotations

from typing import Any

_DFLASH = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
_DSPARK = "sglang.srt.speculative.dspark_components"
_UNO = "sglang.srt.speculative.uno_worker_v2.UnoWorkerV2"
MODEL_RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"

# Per algorithm: (dotted path, hook kind) of its own seams.
WORKER_TARGETS: dict[str, tuple[tuple[str, str], ...]] = {
    "DFLASH": ((f"{_DFLASH}._greedy_sample_from_vocab_parallel_head", "block_draft"),
               (f"{_DFLASH}._propose_selector_block", "block_draft"),
               (f"{_DFLASH}._append_target_hidden_to_draft_kv_by_loc", "block_draft_extend")),
    "DSPARK": ((f"{_DSPARK}.dspark_draft.DraftBlockProposer.propose", "block_draft"),
               (f"{_DSPARK}.dspark_verify.TargetVerifyExecutor.commit_hidden", "block_draft_extend")),
    "UNO": ((f"{_UNO}._run_draft_block", "block_draft"),),
}
# (path, hook kind), all optional: the worker seams, then ModelRunner.forward, which counts the
# draft passes and times a draft-runner pass no named phase encloses (DFLASH's) as draft.
TARGETS: tuple[tuple[str, str], ...] = tuple(t for ts in WORKER_TARGETS.values() for t in ts) + (
    (MODEL_RUNNER_FORWARD, "block_forward"),)

# The hooks read only ``self`` (the runner); every other argument passes through untouched.
SIGNATURES: dict[str, tuple[str, ...]] = {path: ("self",) for path, _ in TARGETS}
SIGNATURES.update({MODEL_RUNNER_FORWARD: ("self", "forward_batch"),
                   f"{_UNO}._run_draft_block": ("self", "forward_batch")})

# The calls, in source order, that each decode step makes and that the hooks and the unit tests'
# fakes of these workers rely on (a call matches by the tail of its dotted name).  The offline AST
# check verifies them in every release that has the method.
CALL_ORDER: dict[str, tuple[str, ...]] = {
    f"{_DFLASH}.forward_batch_generation": (
        "draft_model_runner.forward", "_greedy_sample_from_vocab_parallel_head",
        "target_worker.forward_batch_generation", "_append_target_hidden_to_draft_kv_by_loc"),
    f"{_DSPARK}.dspark_worker_v2.DSparkWorkerV2._forward_decode": (
        "_proposer.propose", "_verify_executor.run_non_compact", "_verify_executor.accept_and_finalize",
        "_verify_executor.commit_hidden"),
    f"{_DSPARK}.dspark_draft.DraftBlockProposer._run_forward": ("draft_model_runner.forward",),
    f"{_DSPARK}.dspark_verify.TargetVerifyExecutor._forward_prepared_verify": (
        "target_worker.forward_batch_generation",),
    f"{_UNO}._forward_decode": ("_run_draft_block", "_run_target_block", "_accept_and_pack"),
    f"{_UNO}._run_draft_block": ("_run_target_block",),
    f"{_UNO}._run_target_block": ("target_worker.forward_batch_generation",),
}

# First 0.5.x release with each worker (found by the AST check over the wheels); the selector
# sampler of DFLASH came in 0.5.19.
_SINCE = {"DFLASH": 14, "DSPARK": 16, "UNO": 20}
_SELECTOR_SINCE = 19


def release_limits(first_minor: int) -> dict[str, dict[str, str]]:
    """{release: {target: what is lost}} for the supported releases from 0.5.<first_minor>."""
    out: dict[str, dict[str, str]] = {}
    for alg, targets in WORKER_TARGETS.items():
        for minor in range(first_minor, _SINCE[alg]):
            for path, _ in targets:
                out.setdefault(f"0.5.{minor}", {})[path] = f"the {alg} worker does not exist yet"
    for minor in range(max(first_minor, _SINCE["DFLASH"]), _SELECTOR_SINCE):
        out.setdefault(f"0.5.{minor}", {})[f"{_DFLASH}._propose_selector_block"] = (
            "DFLASH has no candidate selector yet (its greedy draft sampler is timed)")
    return out


# ---- readers (CPU values of a result SGLang has already synchronized) ---------------------------
def block_size(result: Any) -> int:
    """Positions of the block, anchor included (DFLASH block_size, DSPARK verify_num_draft_tokens,
    UNO forward_width): the worker reports it as the result's ``speculative_num_draft_tokens``."""
    return int(getattr(result, "speculative_num_draft_tokens", 0) or 0)


def non_draft_tokens(result: Any) -> int:
    """Tokens of each accept length that are not accepted drafts: the bonus, and UNO's clean root."""
    return int(getattr(result, "num_non_draft_tokens_per_req", 1) or 1)


def is_draft_runner(model_runner: Any) -> bool:
    return bool(getattr(model_runner, "is_draft_worker", False))
