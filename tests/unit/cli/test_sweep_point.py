"""One sustained measurement against a stub client (no HTTP): a generation that did not give every
token asked for is an error, and the server-clock figure is only given when the server kept a row
for every one of the request's decode steps."""

from __future__ import annotations

import pytest

from sglang_ctxprof.cli.client import ClientError
from sglang_ctxprof.cli.prompts import PromptPlan
from sglang_ctxprof.cli.sweep_point import sustained, two_point

MS = 1_000_000


class Stub:
    """A server that streams ``got`` of the tokens asked for (3 per chunk) and whose history holds
    ``kept`` step rows of the request's ``steps`` decode steps (2 tokens and 10 ms each)."""

    def __init__(self, got=None, steps=6, kept=6, finish=None):
        self.got, self.steps, self.kept, self.finish = got, steps, kept, finish

    def profile_reset(self):
        return True

    def profile(self):
        return _profile_body()

    def generate_stream(self, ids, n):
        got = n if self.got is None else self.got
        for k in range(3, got + 3, 3):
            meta = {"id": "s1", "prompt_tokens": len(ids), "completion_tokens": min(k, got)}
            if k >= got and self.finish:
                meta["finish_reason"] = self.finish
            yield float(k), meta

    def profile_request(self, rid):
        rows = [{"t_start_ns": i * 11 * MS, "step_ms": 10.0, "committed": 2} for i in range(self.kept)]
        return {"rid": rid, "steps": self.steps, "step_rows": rows}


def _profile_body(steps=4):
    """A ``/ctx_profile`` body of ``steps`` decode steps (none: what a profiler switched off gives)."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.model.records import RankId, StepRecord
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    for k in range(steps):
        agg.observe(StepRecord(k + 1, "decode", "EAGLE", RankId(), ("r",), (20 + k,), (2,), (2,), (False,), 4, 10.0,
                               {"draft": 4.0, "verify": 6.0}))
    return build_profile(agg.snapshot()).to_dict()


class PairStub(Stub):
    """Two-point: the long request gives ``long_got`` tokens, ``finish`` its finish reason."""

    def __init__(self, long_got=None, finish=None, steps=4):
        super().__init__()
        self.long_got, self.long_finish, self.prof_steps = long_got, finish, steps

    def generate(self, ids, n):
        long = n > 8
        got = self.long_got if long and self.long_got is not None else n
        meta = {"id": f"{'l' if long else 's'}1", "prompt_tokens": len(ids), "completion_tokens": got,
                "finish_reason": (self.long_finish if long and self.long_finish else {"type": "length"})}
        return meta, 1.0 + got / 100

    def profile(self):
        return _profile_body(self.prof_steps)

    def profile_request(self, rid):
        return None


def _pair_plan():
    plan = PromptPlan(list(range(10, 500)), "random-ids", seed=0)
    plan.plan([16], 1, ("short", "long"))
    return plan


def test_a_whole_pair_is_a_point():
    out = two_point(PairStub(), 16, 0, _pair_plan(), 4, 64, has_profile=True)
    assert out["decode_tok_s"] == pytest.approx(100.0) and out["breakdown"]["steps"] == 4


@pytest.mark.parametrize("stub, msg", [
    (PairStub(long_got=9, finish={"type": "abort", "message": "Abort before prefill"}),
     "aborted the long request after 9 of 64"),
    (PairStub(long_got=40), "the long request ended after 40 of 64"),
    (PairStub(steps=0), "recorded no decode step"),
], ids=["aborted-200", "cut-short", "profiling-off"])
def test_a_pair_the_server_cut_short_or_did_not_record_is_no_point(stub, msg):
    """SGLang answers an aborted request 200 with the tokens so far: that is no measurement, nor is a
    point whose steps a profiler switched off never recorded (``--resume`` must measure it again)."""
    with pytest.raises(ClientError, match=msg):
        two_point(stub, 16, 0, _pair_plan(), 4, 64, has_profile=True)


def _plan():
    plan = PromptPlan(list(range(10, 500)), "random-ids", seed=0)
    plan.plan([16], 1, ("sustained",))
    return plan


def test_every_step_kept_gives_the_server_clock_figure():
    out = sustained(Stub(), 16, 12, 3, _plan(), has_profile=True)
    assert out["completion_tokens"] == 12 and out["server_decode_tok_s"] > 0 and out["server_windows"]


def test_rows_for_part_of_the_steps_give_no_server_clock_figure():
    out = sustained(Stub(steps=5000, kept=4096), 16, 12, 3, _plan(), has_profile=True)
    assert "server_decode_tok_s" not in out and "server_windows" not in out
    assert "4096 of the request's 5000" in out["server_tok_s_note"]
    assert out["decode_tok_s"] > 0  # the client's figure stays


@pytest.mark.parametrize("stub, msg", [
    (Stub(got=6), "after 6 of 12 tokens"),
    (Stub(got=6, finish={"type": "abort", "message": "out of memory"}), "aborted"),
])
def test_a_generation_that_stopped_early_is_an_error(stub, msg):
    with pytest.raises(ClientError, match=msg):
        sustained(stub, 16, 12, 3, _plan(), has_profile=True)


@pytest.mark.parametrize("unsplit,slower", [(0, 0.0), (8, 0.0), (64, 8.0)],
                         ids=["one-bucket", "crossing-into-an-unsplit-bucket", "an-unsplit-bucket-slower"])
def test_a_breakdown_averages_each_phase_over_the_steps_that_timed_it(unsplit, slower):
    """Under CUDA graphs the verify split is read on sampled steps only: its parts are means over
    those steps (as the live profile's), so the leaves add up to the step, not to a 16th of it.  A
    point whose decode then crosses into a bucket where no split was read (``unsplit`` steps there)
    shares the parts out as the buckets that read it split theirs (``slower``: its verify takes that
    much longer): the leaves still add up."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.cli.sweep_point import breakdown
    from sglang_ctxprof.model.records import RankId, StepRecord, leaf_ms
    from sglang_ctxprof.views.profile import build_profile

    agg, t = Aggregator(), 1_700_000_000 * 10**9
    for k in range(64 + unsplit):
        ph = {"draft": 3.0, "verify": 8.0 + (slower if k >= 64 else 0.0), "draft_extend": 1.0, "overhead": 0.5}
        if k < 64 and k % 16 == 0:
            ph.update({"verify_attn": 5.0, "verify_moe": 2.0, "verify_rest": 1.0})
        ctx = 4000 + k if k < 64 else 4100 + k
        step = 12.5 + (slower if k >= 64 else 0.0)
        agg.observe(StepRecord(k + 1, "decode", "EAGLE", RankId(), ("r",), (ctx,), (3,), (3,), (False,), 4,
                               step, ph, t_start_ns=t, timing="cuda_graph_events", t_end_ns=t + int(step * 1e6),
                               exec_mode="graph", attn_backend="fa3", draft_depth=3))
        t += 12_600_000 + int(slower * 1e6)
    ms = breakdown(build_profile(agg.snapshot()).to_dict())["phases_ms"]
    scale = ms["verify"] / 8.0  # the pooled forward over the split one's
    assert (ms["verify_attn"], ms["verify_moe"], ms["verify_rest"]) == pytest.approx((5.0 * scale, 2.0 * scale, scale))
    assert sum(leaf_ms(ms).values()) == pytest.approx(ms["step"])


def test_a_slow_first_step_is_set_apart_from_the_points_means_as_the_live_profiles():
    """One 300 ms warm-up step among 8.5 ms ones: the point's step and phase times are the robust means
    the live profile and its diagnosis read, so the offline verdict cannot flip on it."""
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.cli.sweep_point import breakdown
    from sglang_ctxprof.model.records import RankId, StepRecord
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    for k in range(32):
        step = 300.0 if k == 0 else 8.5
        agg.observe(StepRecord(k + 1, "decode", "EAGLE", RankId(), ("r",), (100 + k,), (3,), (3,), (False,), 4,
                               step, {"draft": 2.5, "verify": step - 3.5, "draft_extend": 1.0},
                               t_start_ns=k * 400_000_000))
    prof = build_profile(agg.snapshot())
    out = breakdown(prof.to_dict())
    assert out["steps"] == 32 and out["outlier_steps"] == 1
    assert out["mean_ctx"] == pytest.approx(100 + 31 / 2)  # where the steps ran, not the prompt's 100
    assert out["phases_ms"]["step"] == pytest.approx(8.5) == prof.buckets[0].robust_ms("step")
    assert out["phases_ms"]["verify"] == pytest.approx(5.0) and out["buckets"][0]["step_ms"] == pytest.approx(8.5)
