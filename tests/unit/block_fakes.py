"""Fakes of SGLang 0.5.23's block-drafter workers (DFLASH, DSPARK, UNO) for pure unit tests.

SGLang refuses all three on a CPU device at argument validation (see docs/algorithms.md), so
their hooks are driven here by fakes that make the same calls, in the same order, with the same
class and method names as the real workers (``collect.block_adapter.CALL_ORDER``, verified by the
AST check over every release, is asserted against each fake's call log).  The acceptance decision
itself is SGLang's own code: ``compute_dflash_correct_drafts_and_bonus`` + ``_commit_accept`` for
DFLASH, and ``UnoWorkerV2._accept_and_pack`` for UNO (DSPARK's greedy accept is the same prefix
rule; its kernel needs Triton, so it is written out here).

Every model pass "runs" by sleeping ``T`` seconds (the tests patch the sleep into an exact clock)
and every fake appends the dotted name of each call it makes to ``LOG``.
"""

from __future__ import annotations

import time

import torch

from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
from sglang.srt.speculative.dflash_worker_v2 import _commit_accept
from sglang.srt.speculative.uno_worker_v2 import UnoWorkerV2 as _RealUno

T = 0.001
LOG: list[str] = []


class Result:
    """GenerationBatchResult's fields that ctxprof reads (CPU tensors: already synchronized)."""

    def __init__(self, accept_lens, num_draft_tokens, non_draft=1, block_accept_lens=None):
        self.accept_lens = accept_lens
        self.speculative_num_draft_tokens = num_draft_tokens
        self.num_non_draft_tokens_per_req = non_draft
        self.block_accept_lens = block_accept_lens


class ModelRunner:
    """ModelRunner.forward: the draft runner has ``is_draft_worker=True``."""

    def __init__(self, is_draft_worker, layer=None):
        self.is_draft_worker = is_draft_worker
        self.layer = layer

    def forward(self, forward_batch, *a, **k):
        if self.layer is not None:
            self.layer.attn.forward()
            self.layer.moe.forward()
        time.sleep(T)


class TpModelWorker:
    """The target worker; a verify call runs attention and MoE of its layers through ModelRunner."""

    def __init__(self, layer):
        self.model_runner = ModelRunner(False, layer)

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kw):
        self.model_runner.forward(forward_batch)


class Attn:
    def forward(self):
        time.sleep(T)


class MoE:
    def forward(self):
        time.sleep(T)


class Layer:
    def __init__(self):
        self.attn, self.moe = Attn(), MoE()


def _log(name):
    LOG.append(name)


class DFlashWorkerV2:
    """``dflash_worker_v2.DFlashWorkerV2.forward_batch_generation``, decode branch: draft block pass
    on the draft runner, greedy draft sampler, target verify, ``_accept_block``, then the draft KV
    append of the target's hidden states."""

    def __init__(self, block_size, target_predict):
        self.block_size = block_size
        self.target_predict = target_predict  # per step: the target's argmax at each block position
        self.draft_model_runner = ModelRunner(True)
        self.target_worker = TpModelWorker(Layer())
        self.decided: list[list[int]] = []  # what _accept_block decided per step (accepted drafts)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        bs = len(batch.reqs)
        if batch.forward_mode.is_extend():  # target prefill, then the prompt's draft KV
            self.target_worker.forward_batch_generation(batch)
            self._append_target_hidden_to_draft_kv_by_loc(target_hidden=None, cache_loc=None, positions=None,
                                                         extend_lens=None)
            return Result(torch.ones(bs, dtype=torch.int32), self.block_size)
        _log("draft_model_runner.forward")
        self.draft_model_runner.forward(object())
        _log("_greedy_sample_from_vocab_parallel_head")
        draft_next = self._greedy_sample_from_vocab_parallel_head(hidden_states=None, lm_head=None)
        draft_tokens = torch.cat([torch.full((bs, 1), 5), draft_next[:bs]], dim=1)
        _log("target_worker.forward_batch_generation")
        self.target_worker.forward_batch_generation(batch=None, forward_batch=object(), is_verify=True)
        _log("_accept_block")
        accept_len, commit_lens = self._accept_block(candidates=draft_tokens, bs=bs)
        _log("_append_target_hidden_to_draft_kv_by_loc")
        self._append_target_hidden_to_draft_kv_by_loc(target_hidden=None, cache_loc=None, positions=None,
                                                     commit_lens=commit_lens)
        return Result(commit_lens, self.block_size)

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size=256):
        time.sleep(T)
        return torch.arange(6, 6 + self.block_size - 1).repeat(8, 1)  # drafts 6, 7, 8, ... per row

    def _accept_block(self, *, candidates, bs):
        time.sleep(T)  # the accept kernel: overhead
        target_predict = self.target_predict.pop(0).view(bs, self.block_size)
        accept_len, bonus = compute_dflash_correct_drafts_and_bonus(candidates=candidates,
                                                                    target_predict=target_predict)
        _, commit_lens = _commit_accept(candidates, accept_len, bonus)
        self.decided.append([int(x) for x in accept_len])
        return accept_len, commit_lens

    def _append_target_hidden_to_draft_kv_by_loc(self, *, target_hidden, cache_loc, positions,
                                                 cache_loc_2d=None, commit_lens=None, extend_lens=None):
        time.sleep(T)


class DraftBlockProposer:
    """``dspark_draft.DraftBlockProposer``: propose -> _run_forward -> draft_model_runner.forward."""

    def __init__(self, gamma):
        self.gamma = gamma
        self.draft_model_runner = ModelRunner(True)

    def propose(self, *, batch, bs, **kw):
        self._run_forward(bs=bs)
        time.sleep(T)  # the draft sampler
        return torch.arange(6, 6 + self.gamma).repeat(bs, 1)

    def _run_forward(self, *, bs, **kw):
        _log("draft_model_runner.forward")
        self.draft_model_runner.forward(object())


class TargetVerifyExecutor:
    """``dspark_verify.TargetVerifyExecutor``: run_non_compact -> _forward_prepared_verify -> target
    verify; accept_and_finalize (greedy prefix accept); commit_hidden (target hidden -> draft KV)."""

    def __init__(self, target_predict):
        self.target_worker = TpModelWorker(Layer())
        self.target_predict = target_predict
        self.decided: list[list[int]] = []

    def run_non_compact(self, *, batch, **kw):
        return self._forward_prepared_verify(batch=batch)

    def _forward_prepared_verify(self, *, batch, **kw):
        _log("target_worker.forward_batch_generation")
        self.target_worker.forward_batch_generation(batch=None, forward_batch=object(), is_verify=True)

    def accept_and_finalize(self, *, verify_ids_2d, bs, **kw):
        time.sleep(T)
        target = self.target_predict.pop(0).view(bs, -1)
        match = (verify_ids_2d[:, 1:] == target[:, :-1]).to(torch.int32)
        correct = match.cumprod(dim=1).sum(dim=1).to(torch.int32)
        self.decided.append([int(x) for x in correct])
        return correct + 1

    def commit_hidden(self, *, batch, commit_lens, bs, **kw):
        time.sleep(T)


class DSparkWorkerV2:
    """``dspark_worker_v2.DSparkWorkerV2._forward_decode``: propose, verify, accept, commit."""

    def __init__(self, gamma, target_predict):
        self.verify_num_draft_tokens = gamma + 1
        self._proposer = DraftBlockProposer(gamma)
        self._verify_executor = TargetVerifyExecutor(target_predict)

    @property
    def decided(self):
        return self._verify_executor.decided

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        return self._forward_decode(batch, on_publish)

    def _forward_decode(self, batch, on_publish, grammar_barrier=None, coordination_plan=None):
        bs = len(batch.reqs)
        _log("_proposer.propose")
        drafts = self._proposer.propose(batch=batch, bs=bs)
        verify_ids_2d = torch.cat([torch.full((bs, 1), 5), drafts], dim=1)
        _log("_verify_executor.run_non_compact")
        self._verify_executor.run_non_compact(batch=batch)
        _log("_verify_executor.accept_and_finalize")
        commit_lens = self._verify_executor.accept_and_finalize(verify_ids_2d=verify_ids_2d, bs=bs)
        _log("_verify_executor.commit_hidden")
        self._verify_executor.commit_hidden(batch=batch, commit_lens=commit_lens, bs=bs)
        return Result(commit_lens, self.verify_num_draft_tokens, block_accept_lens=commit_lens)


class UnoWorkerV2:
    """``uno_worker_v2.UnoWorkerV2._forward_decode``: the draft block is the target with a LoRA
    (``_run_draft_block`` -> ``_run_target_block`` -> verify-shaped target call), then the verify
    block, then SGLang's own ``_accept_and_pack`` (accept_lens = accepted proposals + 2)."""

    def __init__(self, forward_width, target_predict):
        self.forward_width = forward_width
        self.target_worker = TpModelWorker(Layer())
        self.target_predict = target_predict
        self.decided: list[list[int]] = []

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        return self._forward_decode(batch, on_publish)

    def _forward_decode(self, batch, on_publish):
        bs = len(batch.reqs)
        _log("_run_draft_block")
        self._run_draft_block(object())
        candidates = torch.cat([torch.full((bs, 1), 5),
                                torch.arange(6, 5 + self.forward_width).repeat(bs, 1)], dim=1)
        _log("_run_target_block")
        self._run_target_block(object())
        _log("_accept_and_pack")
        _, accept_lens, _, _ = _RealUno._accept_and_pack(
            candidates=candidates, target_top1=self.target_predict.pop(0).view(bs, self.forward_width),
            committed_seq_lens=torch.zeros(bs, dtype=torch.int64))
        self.decided.append([int(x) - 2 for x in accept_lens])
        return Result(accept_lens, self.forward_width, non_draft=2)

    def _run_draft_block(self, forward_batch, *, need_top1=True):
        _log("_run_target_block")
        return self._run_target_block(forward_batch)

    def _run_target_block(self, forward_batch, *, need_top1=True):
        _log("target_worker.forward_batch_generation")
        self.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True)


class ServerArgs:
    device = "cpu"

    def __init__(self, algorithm, num_draft_tokens):
        self.speculative_algorithm = algorithm
        self.speculative_num_draft_tokens = num_draft_tokens


class Scheduler:
    """run_batch / process_batch_result as SGLang's _resolve_spec_v2_tokens settles a spec-v2 step."""

    def __init__(self, worker, algorithm, num_draft_tokens):
        self.model_worker = worker
        self.server_args = ServerArgs(algorithm, num_draft_tokens)
        self.forward_ct = 0

    def run_batch(self, batch):
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        return self.model_worker.forward_batch_generation(batch)

    def process_batch_result(self, batch, result):
        if batch.forward_mode.is_extend():
            return "processed"  # the prefill's token is the fake Req's first output id already
        for i, req in enumerate(batch.reqs):
            if req.finished():
                continue
            req.spec_verify_ct += 1
            req.output_ids.extend([7] * int(result.accept_lens[i]))
        return "processed"

    def get_internal_state(self, recv_req):
        return {"internal": True}
