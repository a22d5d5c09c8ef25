"""DFLASH, DSPARK and UNO step records, driven through the real hooks by faithful worker fakes.

SGLang 0.5.23 refuses these algorithms on a CPU device (docs/algorithms.md), so no real server
runs them here.  ``block_fakes`` reproduces each worker's decode step (same class and method names,
same call order: checked against ``block_adapter.CALL_ORDER``, which the AST check verifies in every
release) and uses SGLang's own acceptance code, so the records' ``accepted`` are what the worker
decided.  The clock is exact: every fake model pass advances it by ``T``.
"""

from __future__ import annotations

import pytest
import torch

import block_fakes as bf
import fakes
from sglang_ctxprof.collect import block_adapter
from sglang_ctxprof.collect.clocks import CpuClock
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.model.names import LEAF_PHASES
from sglang_ctxprof.model.records import StepRecord, validate
from sglang_ctxprof.testing.session import Capture, instrumented

M = "block_fakes"
_SELECTOR = "_propose_selector_block"  # the fake DFLASH takes the greedy sampler path


def _fake_path(path: str) -> str:
    cls, meth = path.split(".")[-2:]
    return f"{M}.{cls}.{meth}"


TARGETS = (
    Target(f"{M}.Scheduler.get_internal_state", "control", group="control"),
    Target(f"{M}.Scheduler.run_batch", "run_batch"),
    Target(f"{M}.Scheduler.process_batch_result", "process_batch_result"),
    Target(f"{M}.TpModelWorker.forward_batch_generation", "verify"),
    Target(f"{M}.Attn.forward", "attn"),
    Target(f"{M}.MoE.forward", "moe"),
    # the adapter's own block-drafter table, pointed at the fakes by class and method name
    *(Target(_fake_path(p), hook, required=False) for p, hook in block_adapter.TARGETS),
)

BS, BLOCK = 3, 4
# Per step, the target's argmax at each block position; drafts are [anchor=5, 6, 7, 8] per row.
# Row 0 accepts all 3 drafts, row 1 the first only, row 2 none; then 2, 3, 0.
PREDICT = [torch.tensor([[6, 7, 8, 9], [6, 0, 0, 0], [0, 0, 0, 0]]),
           torch.tensor([[6, 7, 0, 0], [6, 7, 8, 1], [1, 1, 1, 1]])]
DECIDED = [[3, 1, 0], [2, 3, 0]]


def _worker(alg: str):
    pred = [t.clone() for t in PREDICT]
    if alg == "DFLASH":
        return bf.DFlashWorkerV2(BLOCK, pred)
    if alg == "DSPARK":
        return bf.DSparkWorkerV2(BLOCK - 1, pred)
    return bf.UnoWorkerV2(BLOCK, pred)


@pytest.fixture
def clock(monkeypatch):
    now = [10**12]  # exact: a fake pass of T seconds advances the profiler's clock by exactly T
    monkeypatch.setattr(bf.time, "sleep", lambda s: now.__setitem__(0, now[0] + round(s * 1e9)))
    return CpuClock(lambda: now[0])


def _run(alg: str, steps: int = 2, clock: CpuClock | None = None):
    bf.LOG.clear()
    worker = _worker(alg)
    with instrumented(TARGETS, clock=clock) as session:
        rep = session.instrumentor.report
        assert {p for p, why in rep.items() if why != "ok"} == {f"{M}.DFlashWorkerV2.{_SELECTOR}"}, rep
        cap = Capture(session.profiler)
        sched = bf.Scheduler(worker, alg, BLOCK)
        reqs = [fakes.Req(f"r{i}", 50 + 1000 * i) for i in range(BS)]
        if alg == "DFLASH":
            pre = fakes.Batch(reqs, mode="EXTEND")
            sched.process_batch_result(pre, sched.run_batch(pre))
        for _ in range(steps):
            batch = fakes.Batch(reqs)
            assert sched.process_batch_result(batch, sched.run_batch(batch)) == "processed"
        records = cap.records()
    return worker, reqs, records


@pytest.mark.parametrize("alg", ["DFLASH", "DSPARK", "UNO"])
def test_fakes_make_sglangs_calls_in_order(alg):
    _run(alg, steps=1)
    cls = {"DFLASH": ("DFlashWorkerV2",), "UNO": ("UnoWorkerV2",),
           "DSPARK": ("DSparkWorkerV2", "DraftBlockProposer", "TargetVerifyExecutor")}[alg]
    orders = [o for p, o in block_adapter.CALL_ORDER.items() if p.split(".")[-2] in cls]
    assert orders
    for order in orders:
        it = iter(bf.LOG)
        assert all(any(c == want for c in it) for want in order), (order, bf.LOG)


# phase -> ms per step (T = 1 ms per fake pass); UNO's draft is the target (attention + MoE + rest)
EXPECTED = {
    "DFLASH": {"draft": 2, "verify": 3, "verify_attn": 1, "verify_moe": 1, "verify_rest": 1,
               "draft_extend": 1, "overhead": 1},
    "DSPARK": {"draft": 2, "verify": 3, "verify_attn": 1, "verify_moe": 1, "verify_rest": 1,
               "draft_extend": 1, "overhead": 1},
    "UNO": {"draft": 3, "verify": 3, "verify_attn": 1, "verify_moe": 1, "verify_rest": 1, "overhead": 0},
}


@pytest.mark.parametrize("alg", ["DFLASH", "DSPARK", "UNO"])
def test_full_phases_tile_the_step(alg, clock):
    _, reqs, records = _run(alg, clock=clock)
    decode = [r for r in records if r.kind == "decode"]
    assert len(decode) == 2
    for rec in decode:
        validate(rec)
        assert rec.algorithm == alg
        ph = rec.phases_ms
        for name, ms in EXPECTED[alg].items():
            assert ph[name] == pytest.approx(ms, abs=1e-9), (alg, name, ph)
        assert "unattributed" not in ph and ph.get("draft_extend", 0.0) == EXPECTED[alg].get("draft_extend", 0)
        assert sum(ph.get(p, 0.0) for p in LEAF_PHASES) == pytest.approx(rec.step_ms, abs=1e-9)
        assert rec.block_size == BLOCK and rec.draft_tokens == BLOCK and rec.denoise_steps == 1
    for r in reqs:  # steps == spec_verify_ct, 1 + sum(committed) == tokens generated
        mine = [rec for rec in decode if r.rid in rec.rids]
        assert len(mine) == r.spec_verify_ct == 2
        assert 1 + sum(rec.committed[rec.rids.index(r.rid)] for rec in mine) == len(r.output_ids)


def test_block_hooks_leave_prefill_alone(clock):
    _, _, records = _run("DFLASH", steps=0, clock=clock)
    (pre,) = records
    assert pre.kind == "prefill" and "draft_extend" not in pre.phases_ms and pre.block_size == 0


@pytest.mark.parametrize("alg", ["DFLASH", "DSPARK", "UNO"])
def test_accepted_prefix_per_request_is_what_the_worker_decided(alg):
    worker, _, records = _run(alg)
    decode = [r for r in records if r.kind == "decode"]
    assert worker.decided == DECIDED  # SGLang's own accept code on the fake block
    non_draft = 2 if alg == "UNO" else 1  # UNO also emits its clean root
    for rec, decided in zip(decode, DECIDED):
        assert list(rec.accepted_drafts) == decided
        assert list(rec.accepted) == [d + non_draft for d in decided]
        assert rec.non_draft_tokens == non_draft and rec.draft_positions == BLOCK - 1
        # position i of the block (1-based) was accepted iff i <= the accepted prefix
        for d in rec.accepted_drafts:
            assert 0 <= d <= rec.draft_positions
    # the block fields survive the trip through builtins (control channel, saved records)
    back = StepRecord.from_dict(decode[0].to_dict())
    assert back == decode[0] and back.accepted_drafts == decode[0].accepted_drafts


def test_old_records_load_with_block_defaults():
    d = {"step_id": 1, "kind": "decode", "rids": ["a"], "accepted": [3], "draft_tokens": 4}
    rec = StepRecord.from_dict(d)
    assert (rec.block_size, rec.denoise_steps, rec.non_draft_tokens) == (0, 0, 1)
    assert rec.accepted_drafts == (2,) and rec.draft_positions == 3


def test_acceptance_by_position_leaves_out_every_non_draft_token():
    """UNO's accept length counts its clean root and the bonus: two tokens that are not drafts."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.model.records import RankId, StepRecord

    agg = Aggregator()
    for a in (2, 3, 5):  # 0, 1 and 3 draft positions accepted, of a 4-position block
        agg.observe(StepRecord(step_id=a, kind="decode", algorithm="UNO", rank=RankId(0, 0, 0),
                               rids=("r",), ctx_lens=(100,), accepted=(a,), committed=(a,),
                               finished=(False,), draft_tokens=5, step_ms=1.0, phases_ms={},
                               non_draft_tokens=2))
    (counts,) = agg.acceptance.values()
    want = Aggregator()
    for d in (0, 1, 3):
        want.observe(StepRecord(step_id=d, kind="decode", algorithm="DFLASH", rank=RankId(0, 0, 0),
                                rids=("r",), ctx_lens=(100,), accepted=(d + 1,), committed=(d + 1,),
                                finished=(False,), draft_tokens=5, step_ms=1.0, phases_ms={}))
    assert counts == list(want.acceptance.values())[0]
