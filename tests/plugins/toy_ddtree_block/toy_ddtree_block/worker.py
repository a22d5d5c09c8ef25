"""The toy DDTree worker on the DFLASH block drafter: its own decode step, proposal and KV append.

``ToyDDTreeBlockWorker`` subclasses SGLang's ``DFlashWorkerV2`` (drafter, draft KV pool, aux hidden
capture and prefill are DFLASH's) and replaces the decode step with :meth:`_tree_step`:

1. draft: lay out the block ``[bonus, mask, ...]``, run the drafter once over it (one denoising
   pass), and build the draft from the block's per-position distributions with this worker's own
   :meth:`_tree_from_block`.  A real DDTree expands a tree of the top candidates per position; the
   CPU verify mask here is a chain (intel_amx, ``tree_topk = 1``), so the toy keeps the top-1 path;
2. verify: the target over the chain through ``target_worker.forward_batch_generation(
   is_verify=True)``, SGLang's generic verify, which ctxprof times as ``verify``;
3. acceptance: DFLASH's ``_accept_block`` (undeclared: ctxprof reports its time as ``unattributed``);
4. draft_extend: :meth:`_append_block_kv`, the committed tokens' target hidden states projected into
   the drafter's KV, with SGLang's DFLASH projection code taken at import time (unwrapped if a
   profiler had already wrapped it), standing in for a DDTree drafter's own code.

None of these methods is one ctxprof hooks, so ctxprof cannot name them; with
``TOY_DDTREE_BLOCK_DECLARE_PHASES=1`` steps 1 and 4 declare ``sglang_ctxprof.phase("draft")`` /
``phase("draft_extend")``.  Batches this toy does not handle (grammar, logprobs, and the DFLASH
options selector / LiLiCorr / Domino / compact draft cache / Mamba targets) are refused at start
or run DFLASH's own step (grammar, logprobs).
"""

from __future__ import annotations

import contextlib
import os

import torch
from sglang.srt.speculative import dflash_worker_v2 as dw
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from . import DECLARE_ENV


def _own(fn):
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__ctxprof_wrapper__", False) else fn


_PROJECT_KV = _own(DFlashWorkerV2.__dict__["_append_target_hidden_to_draft_kv_by_loc"])
_DECLARE = os.environ.get(DECLARE_ENV) == "1"


def _phase(name: str):
    if not _DECLARE:
        return contextlib.nullcontext()
    import sglang_ctxprof

    return sglang_ctxprof.phase(name)


class ToyDDTreeBlockWorker(DFlashWorkerV2):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        unsupported = {"selector": self.selector is not None, "lilicorr": self.lilicorr is not None,
                       "domino": self._is_domino, "compact draft cache": self.use_compact_draft_cache,
                       "mamba target": self._need_mamba_verify_commit}
        bad = sorted(k for k, v in unsupported.items() if v)
        if bad:
            raise ValueError(f"TOY_DDTREE_BLOCK does not support DFLASH options {bad}")

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        fm = batch.forward_mode
        if fm.is_extend() or batch.is_extend_in_batch or fm.is_idle() or batch.has_grammar or batch.return_logprob:
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        self._validate_phase1_sampling_support(batch)
        return self._tree_step(batch, on_publish)

    # ---- the decode step ------------------------------------------------------------------------
    def _tree_step(self, batch, on_publish):
        draft_input = batch.spec_info
        bs, k = len(batch.seq_lens), int(self.block_size)
        prefix_lens = batch.seq_lens
        # carried over from the previous overlap iteration, possibly from another stream (as DFLASH)
        prefix_lens.record_stream(torch.get_device_module(self.device).current_stream())
        with _phase("draft"):
            tokens, positions, cache_loc_2d, kv_loc_plan = self._draft_block(batch, draft_input, bs, k)
        target_out = self._verify_block(batch, draft_input, tokens, positions, cache_loc_2d, kv_loc_plan, k)
        logits_output = target_out.logits_output
        _, commit_lens, bonus, out_tokens, new_seq_lens = self._accept_block(
            candidates=tokens, next_token_logits=logits_output.next_token_logits,
            sampling_info=batch.sampling_info, draft_input=draft_input, prefix_lens=prefix_lens, bs=bs)
        if new_seq_lens is None:
            new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        with _phase("draft_extend"):
            self._append_block_kv(logits_output.hidden_states, kv_loc_plan, cache_loc_2d, positions,
                                  commit_lens, bs, k)
        logits_output.hidden_states = None
        next_draft_input = self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
        return dw.GenerationBatchResult(
            logits_output=logits_output, next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph, next_draft_input=next_draft_input,
            speculative_num_draft_tokens=k, new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output)

    def _draft_block(self, batch, draft_input, bs: int, k: int):
        """One denoising pass of the drafter over ``[bonus, mask, ...]``; the draft from its outputs."""
        target_model = self.target_worker.model_runner.model
        embed = dw.unwrap_lora_layer(dw._resolve_dflash_embedding_module(self.draft_model, target_model))
        lm_head = dw.unwrap_lora_layer(target_model.lm_head)
        self._ensure_draft_block_buffers(bs)
        prefix_lens = batch.seq_lens
        block_ids = self._draft_block_ids_buf[:bs]
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        positions_2d = self._draft_block_positions_buf[:bs]
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        cache_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        cache_loc_2d.copy_(dw.assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens, end_offset=prefix_lens + k, batch_size=bs, draft_token_num=k,
            device=self.device).view(bs, k))
        emb = (torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
               if self._full_embed_gpu is not None else embed(block_ids))
        if self._noise_embed_scale != 1.0:
            emb = emb * self._noise_embed_scale
        positions, cache_loc = positions_2d.reshape(-1), cache_loc_2d.reshape(-1)
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        host_lens = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
        kv_loc_plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, seq_lens_cpu=host_lens,
            write_virtual=cache_loc, read_extent=k)
        seq_lens_cpu.copy_(host_lens)
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu.add_(k)  # host bound: committed prefix + one block
        fb = dw.ForwardBatch(
            forward_mode=dw.ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, out_cache_loc=cache_loc,
            seq_lens_sum=int(seq_lens_cpu.sum()), seq_lens_cpu=seq_lens_cpu, positions=positions,
            input_embeds=emb.view(-1, emb.shape[-1]), spec_algorithm=dw.SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info, capture_hidden_mode=dw.CaptureHiddenMode.NULL,
            num_token_non_padded=(torch.full((), bs * k, dtype=torch.int32, device=self.device)
                                  if dw.enable_num_token_non_padded() else None),
            global_num_token_non_padded_cpu=bs * k, can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph)
        kv_loc_plan.bind(fb, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), dw.draft_tp_context(self.draft_parallel_layout):
            out = self.draft_model_runner.forward(fb)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("TOY_DDTREE_BLOCK: the drafter returned no hidden states")
        tokens = self._draft_block_tokens_buf[:bs]
        tokens[:, 0].copy_(block_ids[:, 0])
        tokens[:, 1:].copy_(self._tree_from_block(hidden.view(bs, k, -1)[:, 1:, :], lm_head))
        return tokens, positions, cache_loc_2d, kv_loc_plan

    def _tree_from_block(self, hidden, lm_head):
        """The draft from the block's per-position distributions: the top-1 path of the tree.

        ``hidden``: [bs, k-1, h] drafter outputs of the masked positions.  Logits over the real
        vocabulary (the head's padding rows left out), one argmax per position."""
        weight = lm_head.weight
        shard = getattr(lm_head, "shard_indices", None)
        vocab = int(shard.num_org_elements) if shard is not None else int(weight.shape[0])
        logits = torch.matmul(hidden.to(weight.dtype), weight[:vocab].T)
        return torch.argmax(logits, dim=-1).to(torch.long)

    def _verify_block(self, batch, draft_input, tokens, positions, cache_loc_2d, kv_loc_plan, k: int):
        verify_input = dw.DFlashVerifyInput(
            draft_token=tokens.reshape(-1), positions=positions, draft_token_num=k, custom_mask=None,
            capture_hidden_mode=dw.CaptureHiddenMode.FULL, kv_loc_plan=kv_loc_plan)
        batch.out_cache_loc = cache_loc_2d.reshape(-1)
        saved = batch.seq_lens_cpu, batch.seq_lens_sum
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + k
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif draft_input.nxt_kv_lens_cpu is not None:
            batch.seq_lens_cpu = draft_input.nxt_kv_lens_cpu
            batch.seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
        fb, _ = verify_input.prepare_for_verify(batch, self.target_worker, defer_metadata_init=False)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved
        out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=fb, is_verify=True, skip_attn_backend_init=True)
        logits = out.logits_output
        lp = self._target_logits_processor
        if lp is not None and lp.is_deferred_shard(logits.next_token_logits):
            logits.next_token_logits = lp.finish_deferred_gather(logits.next_token_logits)
        if batch.sampling_info is not None:
            dw.apply_dflash_verify_logits_adjustments(
                next_token_logits=logits.next_token_logits, sampling_info=batch.sampling_info,
                draft_token_num=k)
        return out

    def _append_block_kv(self, hidden, kv_loc_plan, cache_loc_2d, positions, commit_lens, bs: int, k: int):
        """The committed tokens' target hidden states into the drafter's KV (the next block's context)."""
        if hidden is None:
            raise RuntimeError("TOY_DDTREE_BLOCK: verify returned no target hidden states")
        hidden = hidden.view(bs * k, -1)
        cache_loc = self._draft_write_ids(kv_loc_plan)
        _PROJECT_KV(self, target_hidden=hidden, cache_loc=cache_loc, cache_loc_2d=cache_loc.view(cache_loc_2d.shape),
                    positions=positions, commit_lens=commit_lens)
