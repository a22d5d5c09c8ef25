"""The data the diagnosis stands on: acceptance by position, execution mode, host gaps and the
request waterfall, the robust fit, prefill labels - pure parts, plus a fake-device downgrade."""

from __future__ import annotations

import pytest

import gpu_fakes as gf
from fakes import Batch, Req
from sglang_ctxprof.aggregate import acceptance as acc
from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.snapshot import Snapshot, merge
from sglang_ctxprof.collect.adapter import Target
from sglang_ctxprof.collect.session import CtxProfSession
from sglang_ctxprof.model.config import CtxProfConfig
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.model.stats import LinearFit, theil_sen
from sglang_ctxprof.testing.session import Capture
from sglang_ctxprof.views.profile import Profile, build_profile

MS = 1_000_000
BASE = 1_700_000_000 * 10**9  # a host clock reading (t_start_ns 0 means "unknown")


def rec(step_id, rids, ctx, accepted, *, kind="decode", step_ms=10.0, t0=0, t_end=None, depth=3,
        mode="eager", reason="CUDA graphs disabled", cached=(), phases=None):
    n = len(rids)
    return StepRecord(step_id=step_id, kind=kind, algorithm="EAGLE", rank=RankId(), rids=tuple(rids),
                      ctx_lens=tuple(ctx), accepted=tuple(accepted), committed=tuple(accepted),
                      finished=(False,) * n, draft_tokens=depth + 1 if kind == "decode" else 0,
                      step_ms=step_ms, phases_ms=phases or ({"draft": 2.0, "verify": step_ms - 3.0,
                                                           "verify_attn": step_ms - 5.0, "verify_moe": 1.0,
                                                           "verify_rest": 1.0, "draft_extend": 0.5,
                                                           "overhead": 0.5} if kind == "decode" else {}),
                      t_start_ns=BASE + t0,
                      t_end_ns=BASE + (t_end if t_end is not None else t0 + int(step_ms * MS)),
                      exec_mode=mode if kind == "decode" else "", exec_reason=reason if kind == "decode" else "",
                      attn_backend="intel_amx" if kind == "decode" else "", draft_depth=depth if kind == "decode" else 0,
                      cached_lens=tuple(cached))


def test_acceptance_by_position_formulas_and_unobserved_budget():
    counts: dict[str, int] = {}
    for budget, correct in [(3, 3), (3, 1), (3, 0), (1, 1)]:
        acc.add(counts, budget, correct)
    v = acc.view(counts)
    assert v["n_steps"] == 4 and v["hist"] == [1, 2, 0, 1]
    # position 1: observed by all 4, accepted by 3; positions 2 and 3: the budget-1 step is unobserved
    assert v["observed"] == [4, 3, 3]
    assert v["p"] == pytest.approx([3 / 4, 1 / 3, 1 / 3])
    assert v["c"] == pytest.approx([3 / 4, (1 / 3) / (3 / 4), 1.0])
    assert v["mean_len"] == pytest.approx(1 + (3 + 1 + 0 + 1) / 4)


def test_acceptance_is_keyed_by_each_requests_own_context():
    agg = Aggregator()
    # a batch of a 100- and a 3000-token request: the batch mean (1550) falls in 1024-2047
    agg.observe(rec(1, ["a", "b"], [100, 3000], [4, 1]))
    agg.observe(rec(2, ["a", "b"], [104, 3001], [2, 1]))
    prof = build_profile(agg.snapshot())
    assert [b.label for b in prof.buckets] == ["1024-2047"]
    by = {a["label"]: a["acceptance_by_position"] for a in prof.acceptance_by_ctx}
    assert set(by) == {"64-127", "2048-4095"}
    assert by["64-127"]["hist"] == [0, 1, 0, 1] and by["2048-4095"]["hist"] == [2, 0, 0, 0]
    assert prof.buckets[0].acceptance_by_position is None  # no request's own context in 1024-2047
    d = prof.to_dict()
    assert Profile.from_dict(d).to_dict() == d


def test_exec_mode_cpu_reads_eager_cuda_graphs_disabled():
    agg = Aggregator()
    agg.observe(rec(1, ["a"], [100], [3]))
    x = build_profile(agg.snapshot()).buckets[0].exec_mode
    assert x["eager"] == 1 and x["graph"] == 0 and x["attn_backend"] == "intel_amx"
    assert x["downgrade"] is False and x["reason"] == "CUDA graphs disabled"
    assert acc.describe_exec(x) == "eager (CUDA graphs disabled)"


def test_fake_device_downgrade_when_the_graph_runner_refuses_a_batch_size():
    """CUDA graphs on, captured up to batch size 1: a batch of 2 runs verify eagerly -> downgrade."""

    def Worker():
        w = gf.Worker()
        # the target's graph runner captured batch size 1 only; the result carries what it decided
        w.target.runner.can_run_graph = lambda forward_batch: len(forward_batch.reqs) <= 1
        return w

    class Args:
        speculative_algorithm = "EAGLE"
        speculative_num_draft_tokens = 4
        device = "cuda"
        disable_cuda_graph = False
        cuda_graph_max_bs = 1
        attention_backend = "fa3"

    gf.reset()
    targets = [Target(path, hook) for path, hook in gf.TARGETS_SPEC]
    session = CtxProfSession(CtxProfConfig(), targets=targets)
    assert set(session.instrument().values()) == {"ok"}
    try:
        p = session.profiler
        cap = Capture(p)
        sched = gf.Scheduler(None)
        p.bind(sched)
        sched.server_args = Args()
        sched.model_worker = Worker()
        sched.loop_overlap([Batch([Req("a", 100)]) for _ in range(3)]
                           + [Batch([Req("b", 100), Req("c", 120)]) for _ in range(2)])
        recs = cap.records()
        assert [r.exec_mode for r in recs] == ["graph"] * 3 + ["eager"] * 2
        assert recs[-1].exec_reason == "batch size 2 larger than the largest captured (1)"
        agg = Aggregator()
        for r in recs:
            agg.observe(r)
        x = build_profile(agg.snapshot()).buckets[0].exec_mode
        assert x["graph"] == 3 and x["eager"] == 2 and x["downgrade"] is True
        assert x["downgrade_share"] == pytest.approx(2 / 5) and "largest captured" in x["reason"]
        assert x["attn_backend"] == "fa3" and recs[0].draft_depth == 3
    finally:
        session.uninstrument()


def test_host_gaps_and_waterfall_add_up_to_wall_time():
    agg = Aggregator()
    # request "a": prefill, then decode steps 2, 4, 5; another request's prefill (3) runs between;
    # the scheduler spends 1 ms between steps and 0.5 ms inside run_batch outside the model call.
    agg.observe(rec(1, ["a"], [100], [0], kind="prefill", step_ms=5.0, t0=0, t_end=5 * MS + MS // 2))
    t = 6.5 * MS
    agg.observe(rec(2, ["a"], [101], [3], step_ms=10.0, t0=int(t), t_end=int(t + 10.5 * MS)))
    t += 11.5 * MS
    agg.observe(rec(3, ["b"], [2000], [0], kind="prefill", step_ms=20.0, t0=int(t), t_end=int(t + 20.5 * MS),
                    cached=[500]))
    t += 21.5 * MS
    agg.observe(rec(4, ["a", "b"], [104, 2001], [3, 2], step_ms=14.0, t0=int(t), t_end=int(t + 14.5 * MS)))
    t += 15.5 * MS
    agg.observe(rec(5, ["a", "b"], [107, 2003], [3, 2], step_ms=14.0, t0=int(t), t_end=int(t + 14.5 * MS)))
    r = agg.request_with_waterfall("a")
    w = r["waterfall"]
    assert w["wall_ms"] == pytest.approx(10.5 + 1 + 20.5 + 1 + 14.5 + 1 + 14.5)
    assert w["own_steps_total_ms"] == pytest.approx(38.0)
    assert w["others_prefill_ms"] == pytest.approx(20.0)
    assert w["host_gaps_ms"] == pytest.approx(3 * 1.0 + 4 * 0.5)
    assert w["unaccounted_ms"] == pytest.approx(0.0, abs=1e-6)
    assert sum(w["own_steps_ms"].values()) == pytest.approx(38.0)
    # batch sharing: steps 4 and 5 (bs 2) against bucket 64-127's batch-1 step (10 ms)
    assert w["batch_sharing_ms"] == pytest.approx(8.0)
    assert w["timeline_complete"] is True
    snap = agg.snapshot()
    assert snap.host_gaps.count == 4 and snap.host_gaps.total == pytest.approx(4.0)
    prof = build_profile(snap)
    assert prof.host["between_steps"]["total_ms"] == pytest.approx(4.0)
    # the prefill bucket is the prompt length; the cached part is beside it
    pf = {p.label: p for p in prof.prefill}
    assert pf["1024-2047"].tokens == 2000 and pf["1024-2047"].cached_tokens == 500


def test_batch_sharing_unavailable_without_a_batch_1_baseline():
    agg = Aggregator()
    agg.observe(rec(1, ["a", "b"], [100, 110], [3, 3], t0=MS))
    assert agg.request_with_waterfall("a")["waterfall"]["batch_sharing_ms"] is None


def test_robust_fit_ignores_a_warm_up_outlier():
    pts = [(x / 10, 60.0 + 2.0 * x / 10) for x in range(1, 40)] + [(0.2, 362.0)]
    ols = LinearFit()
    for x, y in pts:
        ols.add(x, y)
    assert ols.solve()["r2"] < 0.5
    ts = theil_sen(pts)
    assert ts["slope"] == pytest.approx(2.0, rel=0.05) and ts["intercept"] == pytest.approx(60.0, rel=0.02)
    agg = Aggregator()
    for i, (x, y) in enumerate(pts):
        agg.observe(rec(i + 1, ["r"], [int(x * 1000)], [2], step_ms=y, t0=(i + 1) * 1000 * MS,
                        phases={"draft": y}))
    f = build_profile(agg.snapshot()).fits["step"]
    assert f.robust["method"] == "theil-sen" and f.best()[0] == pytest.approx(2.0, rel=0.05)
    assert f.to_dict()["robust"]["ms_per_1k_ctx"] == pytest.approx(2.0, rel=0.05)


def test_state_round_trip_merge_and_old_records_load():
    a, b = Aggregator(), Aggregator()
    a.observe(rec(1, ["a"], [100], [3], t0=MS))
    b.observe(rec(1, ["z"], [100], [1], t0=MS, mode="graph", reason=""))
    snaps = [Snapshot.from_dict(x.state()) for x in (a, b)]
    m = merge(snaps)
    assert m.acceptance[1] == {"3:2": 1, "3:0": 1}
    x = build_profile(m).buckets[0].exec_mode
    assert (x["graph"], x["eager"]) == (1, 1)
    old = rec(1, ["a"], [100], [3]).to_dict()
    for k in ("exec_mode", "attn_backend", "t_end_ns", "draft_depth", "exec_reason", "cached_lens"):
        old.pop(k)
    r = StepRecord.from_dict(old)
    assert r.exec_mode == "" and r.t_end_ns == 0 and r.draft_depth == 0


def test_record_counts_are_remembered_per_record_and_equal_a_fresh_count():
    """The aggregator and the live metrics read one record's acceptance one after the other through
    the aggregator's memo: the second read is the first's counts; another record, or other edges,
    is counted afresh; another memo (another aggregator) shares nothing."""
    from sglang_ctxprof.model.buckets import Bucketing

    edges, other = Bucketing.parse("pow2").edges, Bucketing.parse("fixed:1024").edges
    recs = [rec(i, [f"r{k}" for k in range(n)], [100 * (k + 1) for k in range(n)], [1 + k % 4 for k in range(n)])
            for i, n in enumerate((1, 3, 70, 256))]
    memo, mine = acc.CountsMemo(), acc.CountsMemo()
    for r in recs:
        first = memo(r, edges)
        assert first == acc.count_record(r, edges)
        assert memo(r, edges) is first
        assert memo(r, tuple(edges)) is first  # equal edges: the same layout
        assert mine(r, edges) == first and mine(r, edges) is not first  # each memo counts for itself
        assert memo(r, other) == acc.count_record(r, other) != first
    again = rec(0, ["r0"], [100], [4])  # same fields as recs[0] but accepted differs: a new record
    assert memo(again, edges) == acc.count_record(again, edges) != memo(recs[0], edges)


def test_a_batchs_counts_equal_a_request_by_request_count_in_one_bucket_or_many():
    """``count_record`` groups a batch in one pass, by accepted alone where every request's own
    context shares a bucket: either way the counts are those of each request counted in turn
    (contexts on a bucket's edges, unknown accepted lengths, budgets below what was accepted)."""
    import random
    from bisect import bisect_right

    from sglang_ctxprof.model.buckets import Bucketing
    from sglang_ctxprof.model.records import accepted_drafts

    edges = Bucketing.parse("pow2").edges
    rng = random.Random(7)
    spans = [(2048, 4095), (2048, 2048), (4095, 4095), (1, 70000), (1000, 1100), (0, 0)]
    for n in (2, 3, 64, 256):
        for lo, hi in spans:
            ctx = [rng.randint(lo, hi) for _ in range(n)]
            accepted = [rng.randint(0, 6) for _ in range(n)]
            r = rec(1, [f"r{k}" for k in range(n)], ctx, accepted, depth=3)
            want: dict = {}
            for c, a in zip(ctx, accepted):
                if a > 0:
                    correct = accepted_drafts(a, r.non_draft_tokens)
                    k = (max(0, bisect_right(edges, c) - 1), max(3, correct), correct)
                    want[k] = want.get(k, 0) + 1
            assert acc.count_record(r, edges) == want, (n, lo, hi)


def test_the_live_metrics_read_the_aggregators_count_of_a_record():
    """A metrics view handed the aggregator's memo counts a record the aggregator took no second
    time; without one it counts afresh, with the same result."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.views.metrics import MetricsView

    agg = Aggregator()
    r = rec(1, [f"r{k}" for k in range(40)], [100 * (k + 1) for k in range(40)], [1 + k % 4 for k in range(40)])
    agg.observe(r)
    taken = agg.counts(r, agg.bucketing.edges)
    reads: list = []

    def spy(rec_, edges):
        out = agg.counts(rec_, edges)
        reads.append(out)
        return out

    regs = CollectorRegistry(), CollectorRegistry()
    shared = MetricsView(agg.bucketing, regs[0], counts=spy)
    fresh = MetricsView(agg.bucketing, regs[1])
    shared.observe(r)
    fresh.observe(r)
    assert len(reads) == 1 and reads[0] is taken
    samples = [[ln for ln in generate_latest(g).splitlines() if b"_created" not in ln] for g in regs]
    assert samples[0] == samples[1] and any(b"position_accepted_total{" in ln for ln in samples[0])
