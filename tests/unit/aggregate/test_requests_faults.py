"""``RequestLog`` under faults: a retracted request's re-prefill, and a rid used twice."""

from __future__ import annotations

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.requests import RequestLog
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.profile import build_profile


def prefill(step: int, rid: str, ctx: int, com: int = 0) -> StepRecord:
    return StepRecord(step, "prefill", "EAGLE", RankId(), (rid,), (ctx,), (0,), (com,), (False,), 0, 1.0,
                      t_start_ns=step * 10**6)


def decode(step: int, rid: str, ctx: int, com: int = 2, fin: bool = False) -> StepRecord:
    return StepRecord(step, "decode", "EAGLE", RankId(), (rid,), (ctx,), (com,), (com,), (fin,), 3, 2.0,
                      t_start_ns=step * 10**6)


def test_a_retraction_keeps_the_prompt_and_counts_the_reprefill_token():
    log = RequestLog()
    log.observe(prefill(1, "r", 100))  # the first token: the "1" of 1 + committed
    log.observe(decode(2, "r", 101, 2))
    log.observe(decode(3, "r", 103, 2))
    log.observe(prefill(4, "r", 105, com=1))  # retracted, re-prefilled: prompt + 5 output, 1 more
    log.observe(decode(5, "r", 106, 2, fin=True))
    r = log.get("r")
    assert r["prompt_tokens"] == 100 and r["retractions"] == 1
    assert 1 + r["committed"] == 8 and r["steps"] == 3 and r["finished"]


def test_retractions_per_prefill_bucket_and_in_the_totals():
    agg = Aggregator()
    for rec in (prefill(1, "r", 100), decode(2, "r", 101, 2), prefill(3, "r", 103, com=1),
                decode(4, "r", 104, 1, fin=True)):
        agg.observe(rec)
    p = build_profile(agg.snapshot())
    assert p.totals.retractions == 1 and p.totals.committed == 4  # completion_tokens 5
    assert [b.retractions for b in p.prefill] == [1] and p.prefill[0].lo <= 103


def test_a_reused_rid_is_a_new_request():
    log = RequestLog()
    log.observe(prefill(1, "same", 50))
    log.observe(decode(2, "same", 51, 2, fin=True))
    log.observe(prefill(3, "same", 70))  # the client sends the same rid again after the first ended
    log.observe(decode(4, "same", 71, 1))
    log.observe(decode(5, "same", 72, 1, fin=True))
    now = log.get("same")
    assert now["use"] == 1 and now["prompt_tokens"] == 70 and now["steps"] == 2 and now["committed"] == 2
    both = sorted(log.totals(), key=lambda r: r["use"])
    assert [(r["rid"], r["use"], r["steps"], r["prompt_tokens"]) for r in both] == [
        ("same", 0, 1, 50), ("same", 1, 2, 70)]
    assert len(log.slowest(10)) == 2


def test_a_reader_behind_the_log_finds_the_use_each_record_finished():
    """The exporters read a finished request a few records after the log took them: by then its rid
    may name a newer use, running or finished too.  Each finishing record's stamp finds its own use."""
    log = RequestLog()
    recs = [prefill(1, "same", 50), decode(2, "same", 51, 2, fin=True), prefill(3, "same", 70),
            decode(4, "same", 71, 1), decode(5, "same", 72, 1, fin=True), prefill(6, "same", 90)]
    for rec in recs:
        log.observe(rec)
    first, second = log.finished("same", recs[1].end_ns), log.finished("same", recs[4].end_ns)
    assert (first["use"], first["prompt_tokens"], first["committed"]) == (0, 50, 2)
    assert (second["use"], second["prompt_tokens"], second["committed"]) == (1, 70, 2)
    assert log.finished("same", recs[3].end_ns) is None  # it finished nothing
    assert log.finished("other", recs[1].end_ns) is None
    log.observe(decode(7, "same", 91, 1, fin=True))
    log.observe(decode(8, "same", 92, 1, fin=True))  # a record that repeats the finish keeps the first stamp
    assert log.finished("same", decode(7, "same", 91).end_ns)["use"] == 2
    assert log.finished("same", decode(8, "same", 92).end_ns) is None


def test_an_abort_is_found_by_its_end_and_a_reused_rid_by_its_record():
    from sglang_ctxprof.model.records import RequestEnd

    log = RequestLog()
    log.observe(prefill(1, "r", 100))
    end = RequestEnd("r", retracted=True, t_ns=5 * 10**6)
    log.end(end)
    log.observe(prefill(6, "r", 40))  # used again before a reader saw the abort
    got = log.finished("r", end.t_ns)
    assert (got["use"], got["aborted"], got["prompt_tokens"]) == (0, "retracted", 100)


def test_reuse_and_row_shedding_stay_consistent():
    log = RequestLog(max_rows=3)
    for k in range(4):
        log.observe(prefill(10 * k, "x", 10))
        log.observe(decode(10 * k + 1, "x", 11, 1))
        log.observe(decode(10 * k + 2, "x", 12, 1, fin=True))
    assert log.rows <= 3
    assert sorted((r["use"], r["steps"]) for r in log.totals()) == [(0, 2), (1, 2), (2, 2), (3, 2)]


def test_an_abort_while_waiting_ends_the_request():
    from sglang_ctxprof.model.records import RequestEnd

    log = RequestLog()
    log.observe(prefill(1, "r", 100))
    log.observe(decode(2, "r", 101, 2))
    log.end(RequestEnd("r", retracted=True))  # retracted, then aborted before its re-prefill
    log.end(RequestEnd("q"))  # aborted before its first step: counted, not kept
    r = log.get("r")
    assert r["finished"] is True and r["aborted"] == "retracted" and r["steps"] == 1
    assert log.get("q") is None and log.aborted == 2
    log.observe(prefill(3, "r", 50))  # the rid again: a new request, not the aborted one
    assert log.get("r")["use"] == 1 and log.get("r")["aborted"] == ""
    log.end(RequestEnd("r"))  # the new use aborted between prefill chunks: it had been prefilled
    assert log.get("r")["aborted"] == "queued"


def test_a_finished_rid_stepping_after_profiling_stopped_is_a_new_use():
    """A decode step of a finished rid after profiling stopped and started is a new use (its prefill
    went unseen), partial; before that, a repeated finishing row stays with the use it finished."""
    log = RequestLog()
    for rec in (prefill(1, "r", 40), decode(2, "r", 41, 1, fin=True), decode(3, "r", 42, 1, fin=True)):
        log.observe(rec)
    assert (log.get("r")["use"], log.get("r")["steps"]) == (0, 2)
    log.interrupt()
    log.observe(decode(4, "r", 60, 1))
    assert (log.get("r")["use"], log.get("r")["steps"]) == (1, 1) and log.tally("r") is None


def test_a_decode_row_riding_a_mixed_batch_commits_its_token_and_is_no_retraction():
    """``--enable-mixed-chunk``: a running request decodes inside another's prefill step.  Its row
    (``accepted`` 1) commits its token; it is neither a retraction (in the request or the prefill
    bucket) nor prefill time of the request."""
    agg = Aggregator()
    for rec in (prefill(1, "r", 100), decode(2, "r", 101, 2)):
        agg.observe(rec)
    mixed = StepRecord(3, "prefill", "EAGLE", RankId(), ("new", "r"), (50, 103), (0, 1), (0, 1), (False, False),
                       0, 4.0, t_start_ns=3 * 10**6)
    agg.observe(mixed)
    agg.observe(decode(4, "r", 104, 1, fin=True))
    r = agg.requests.get("r")
    assert (r["retractions"], r["committed"], r["prompt_tokens"], r["prefill_ms"]) == (0, 4, 100, 1.0)
    assert agg.requests.get("new")["prompt_tokens"] == 50
    p = build_profile(agg.snapshot())
    assert p.totals.retractions == 0 and p.totals.committed == 2 + 1 + 1  # 1 + committed == completion_tokens
    assert [(b.retractions, b.decoded) for b in p.prefill] in ([(0, 1)], [(0, 0), (0, 1)], [(0, 1), (0, 0)])


def test_a_request_retracted_then_aborted_counts_its_retractions_as_sglang_does():
    """Retracted (twice), then aborted before it was prefilled again: no re-prefill ever said so, so
    the end carries SGLang's own count (``req.retraction_count``, the client's ``num_retractions``);
    one aborted before its first step says it in its summary too."""
    from sglang_ctxprof.aggregate.request_entry import aborted_summary
    from sglang_ctxprof.model.records import RequestEnd

    log = RequestLog()
    log.observe(prefill(1, "r", 100))
    log.observe(decode(2, "r", 101, 2))
    log.observe(prefill(3, "r", 103, com=1))  # its first retraction's re-prefill
    log.end(RequestEnd("r", retracted=True, retractions=2))
    assert (log.get("r")["retractions"], log.get("r")["aborted"]) == (2, "retracted")
    assert aborted_summary(RequestEnd("q", retracted=True, retractions=1))["retractions"] == 1
