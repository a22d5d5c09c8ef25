"""aggregate/requests: a large batch's decode step is folded a chunk of requests at a time (stages),
with the same result as one ``observe``; kept step rows add nothing to the garbage collector's walk."""

from __future__ import annotations

import gc
from dataclasses import replace

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.requests import CHUNK, RequestLog
from sglang_ctxprof.model.records import RankId, StepRecord


def _step(i: int, n: int, fin_last: bool = False) -> StepRecord:
    return StepRecord(step_id=i, kind="decode", algorithm="EAGLE", rank=RankId(),
                      rids=tuple(f"r{k}" for k in range(n)), ctx_lens=tuple(100 + i + k for k in range(n)),
                      accepted=tuple(1 + k % 3 for k in range(n)), committed=tuple(1 + k % 3 for k in range(n)),
                      finished=tuple(fin_last and k == n - 1 for k in range(n)), draft_tokens=4,
                      step_ms=2.0 + i, phases_ms={"draft": 1.0, "verify": 1.0 + i}, t_start_ns=10**18 + i * 10**7)


def _prefill(i: int, n: int, committed: int = 0) -> StepRecord:
    return StepRecord(step_id=i, kind="prefill", algorithm="EAGLE", rank=RankId(),
                      rids=tuple(f"r{k}" for k in range(n)), ctx_lens=(100,) * n, accepted=(0,) * n,
                      committed=(committed,) * n, finished=(False,) * n, draft_tokens=0, step_ms=5.0,
                      t_start_ns=10**18 - 10**7)


def test_a_large_step_is_folded_a_chunk_of_requests_at_a_time():
    n = 3 * CHUNK + 5
    log = RequestLog()
    stages = log.stages(_step(0, n))
    next(stages)  # the first chunk, then a hand-over
    assert len(log) == CHUNK
    assert sum(1 for _ in stages) == 2  # three more chunks, a hand-over between two
    assert len(log) == n and log.rows == n


def test_stages_fold_what_observe_folds():
    whole, staged = RequestLog(max_steps=3), RequestLog(max_steps=3)
    for i in range(5):  # past max_steps: folded totals as well as rows
        rec = _step(i, 2 * CHUNK + 1, fin_last=i == 4)
        whole.observe(rec)
        for _ in staged.stages(rec):
            pass
    assert staged.to_state(with_steps=True) == whole.to_state(with_steps=True)
    r = whole.get("r7")
    assert r["steps"] == 5 and r["steps_truncated"] == 2 and len(r["step_rows"]) == 3
    assert r["step_rows"][-1]["ctx_len"] == 102 + 7 and r["ctx_last"] == 104 + 7
    assert r["t_end_ns"] == 10**18 + 4 * 10**7 + 6 * 10**6  # the last (folded) step's end


def test_kept_step_rows_add_no_tracked_object_per_request_and_step():
    """~65k rows kept: a tracked object per row would lengthen every full collection's walk on the
    drain thread, and feed the full collections themselves.  Rows are columns: a decode step of 64
    requests leaves a few tracked objects, not 64, also between full collections (young ones only)."""
    log = RequestLog()
    log.observe(_step(0, 64))
    gc.collect()
    before = len(gc.get_objects())
    for i in range(1, 101):
        log.observe(_step(i, 64))
    gc.collect(1)  # the young generations only, as the collector does between two full collections
    grown = len(gc.get_objects()) - before
    assert grown < 10 * 100, grown  # one row tuple per request and step: 6400 and more
    r0 = log.get("r0")
    assert len(r0["step_rows"]) == 101 and r0["step_rows"][0]["phases_ms"] == {"draft": 1.0, "verify": 1.0}
    assert [r["ctx_len"] for r in r0["step_rows"][:3]] == [100, 101, 102]


def test_tally_is_the_summarys_steps_accepted_and_committed():
    """What the self-audit reads: the same steps, accepted and committed a summary shows (folded
    steps past ``max_steps`` plus kept rows), without building a row."""
    log = RequestLog(max_steps=3)
    log.observe(_prefill(-1, 4))
    for i in range(5):
        log.observe(_step(i, 4))
    got = log.get("r2")
    assert log.tally("r2")[:3] == (got["steps"], got["accepted"], got["committed"]) and got["steps"] == 5
    assert len(got["step_rows"]) == 3 and log.tally("nope") is None
    log.max_rows = 0  # rows dropped past the budget fold into the totals: the tally stays
    log.observe(_step(5, 4))
    got = log.get("r2")
    assert got["step_rows"] == [] and (got["steps"], got["accepted"], got["committed"]) == (6, 18, 18)
    assert log.tally("r2")[:3] == (6, 18, 18)


def test_a_step_larger_than_the_ring_evicts_as_if_recorded_request_by_request():
    """The ring holds 3; a step of 5 new requests keeps the last 3, then a step that brings back an
    evicted one evicts the least recently updated: the order of a one-by-one fold."""
    log = RequestLog(capacity=3)
    log.observe(_step(0, 5))
    assert list(log._reqs) == ["r2", "r3", "r4"] and log.evicted == 2 and log.rows == 3
    log.observe(StepRecord(step_id=1, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("r0", "r3"),
                           ctx_lens=(7, 8), accepted=(1, 1), committed=(1, 1), finished=(False, True),
                           draft_tokens=4, step_ms=1.0, phases_ms={"draft": 1.0}, t_start_ns=10**18 + 10**7))
    assert list(log._reqs) == ["r4", "r0", "r3"] and log.evicted == 3 and log.rows == 4
    assert log.get("r3")["finished"] and [r["ctx_len"] for r in log.get("r3")["step_rows"]] == [103, 8]
    assert log.rows == sum(len(r["step_rows"]) for r in log.to_state(True))


def test_shedding_rows_past_the_budget_is_a_stage_of_its_own_and_folds_what_observe_folds():
    whole, staged = RequestLog(max_rows=CHUNK), RequestLog(max_rows=CHUNK)
    counts = []
    for i in range(3):
        rec = _step(i, CHUNK + 1)
        whole.observe(rec)
        counts.append(sum(1 for _ in staged.stages(rec)))
    assert counts == [2, 2, 2]  # two chunks, a hand-over between; then one more before the shedding
    assert staged.to_state(with_steps=True) == whole.to_state(with_steps=True)
    assert staged.rows == whole.rows <= CHUNK


def _walk() -> int:
    """References a full collection follows (each tracked object's referents)."""
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def test_kept_step_rows_add_nothing_to_a_collections_walk():
    """A collection walks every reference its tracked objects hold; rows kept as cells of a list (4
    references per row) made each one ~0.26 M references longer at the default budget, young
    collections too while a request's row list was young.  Rows are ints in untracked arrays: what
    a collection walks grows with the steps kept (their shared facts), not with the rows."""
    log = RequestLog()
    log.observe(_step(0, 64))
    gc.collect()
    before = _walk()
    for i in range(1, 101):
        log.observe(_step(i, 64))
    gc.collect()
    grown = _walk() - before
    assert log.rows == 101 * 64 and grown < 6400 // 4, grown


def test_the_steps_table_lets_go_of_steps_no_kept_row_refers_to():
    """A row refers to its step's shared facts by key; steps whose rows were all shed (or whose
    requests left the ring) leave the table, the others stay and read back whole."""
    from sglang_ctxprof.aggregate.requests import PRUNE

    log = RequestLog(max_rows=4 * 16, max_steps=3)
    log.observe(_step(0, 2))  # r0, r1: three rows each, then folded; kept while the ring holds them
    for i in range(1, 3 * PRUNE):
        log.observe(replace(_step(i, 16), rids=tuple(f"s{i // 3}-{k}" for k in range(16))))
    assert len(log._metas) <= 2 * PRUNE and log.rows <= 4 * 16
    kept = [r for r in log.to_state(with_steps=True) if r["step_rows"]]
    assert kept and all(row["phases_ms"]["verify"] == 1.0 + row["step_id"] for r in kept for row in r["step_rows"])
    assert min(log._metas) == min(row["step_id"] for r in kept for row in r["step_rows"])


def test_one_long_request_past_max_steps_pins_no_meta_per_step():
    """A request past ``max_steps`` folds its steps: a step that appends no row keeps no meta, and a
    meta no kept row refers to is let go even when it sits between two that are."""
    log = RequestLog(capacity=16, max_steps=8)
    for i in range(20000):
        log.observe(_step(i, 1))
    assert log.rows == 8 and log.get("r0")["steps"] == 20000
    assert len(log._metas) <= 2 * 8, len(log._metas)
    assert [row["step_id"] for row in log.get("r0")["step_rows"]] == list(range(8))


def test_metas_between_kept_rows_are_let_go():
    """An old request keeps its first rows while newer requests come and go: their steps' metas leave
    the table though older keys stay referenced, and every kept row reads back whole."""
    from sglang_ctxprof.aggregate.requests import PRUNE

    log = RequestLog(capacity=4, max_steps=4)
    log.observe(_step(0, 1))  # r0: kept at the ring's newest end by every later step
    for i in range(1, 3 * PRUNE):
        log.observe(replace(_step(i, 2), rids=("r0", f"s{i}")))  # s<i>: one row, evicted soon after
    kept = {row["step_id"] for r in log.to_state(with_steps=True) for row in r["step_rows"]}
    assert len(log._metas) <= len(kept) + PRUNE, (len(log._metas), len(kept))
    assert all(row["phases_ms"]["verify"] == 1.0 + row["step_id"]
               for r in log.to_state(with_steps=True) for row in r["step_rows"])


def test_an_entry_made_after_its_prefill_is_partial_and_has_no_tally():
    """Evicted, then added again by a decode step or a retraction's re-prefill: its totals miss what
    came before, so it has no tally (the self-audit checks it for nothing); its summary is as before."""
    log = RequestLog(capacity=2)
    log.observe(_prefill(0, 1))
    log.observe(_step(1, 1))
    assert log.tally("r0") == (1, 1, 1, 0)
    log.observe(replace(_prefill(2, 1), rids=("x",)))
    log.observe(replace(_prefill(3, 1), rids=("y",)))  # r0 evicted
    log.observe(_step(4, 1))  # r0 back, with one step of two
    assert log.tally("r0") is None and log.get("r0")["steps"] == 1 and log.get("r0")["partial"]
    log.observe(_prefill(5, 2, committed=1))  # r1's re-prefill after a retraction: new to the ring
    log.observe(_step(6, 2))
    assert log.tally("r1") is None and log.tally("r0") is None
    log.clear()
    log.observe(_prefill(7, 1))
    log.observe(_prefill(8, 1, committed=1))  # a retraction the history saw from the start
    log.observe(_step(9, 1))
    assert log.tally("r0") == (1, 1, 2, 0)


def test_a_re_prefill_first_seen_in_chunks_keeps_sglangs_prompt_and_is_partial():
    """History cleared while a request waited retracted, then its re-prefill (prompt 100 + 30 tokens
    out) in two chunks: only the last appends its token.  The entry has SGLang's prompt tokens, not
    prompt + output, and no tally from the first chunk on (its first prefill and steps went unseen);
    a first prefill in chunks is whole."""
    log = RequestLog()
    chunk = replace(_prefill(0, 1), ctx_lens=(130,), prompt_lens=(100,))
    log.observe(chunk)
    assert log.get("r0")["prompt_tokens"] == 100 and log.tally("r0") is None
    log.observe(replace(chunk, step_id=1, committed=(1,)))
    log.observe(_step(2, 1))
    r = log.get("r0")
    assert r["prompt_tokens"] == 100 and r["retractions"] == 1 and log.tally("r0") is None
    log.clear()
    first = replace(_prefill(3, 1), prompt_lens=(100,))
    log.observe(first)
    log.observe(replace(first, step_id=4))
    log.observe(_step(5, 1))
    assert log.get("r0")["prompt_tokens"] == 100 and log.tally("r0") == (1, 1, 1, 0)


def test_the_requests_running_when_profiling_stops_are_partial():
    """Switched off mid-request (``interrupt``), a request misses the steps until profiling is back:
    no tally; a finished one keeps its tally, a new one after has its own."""
    log = RequestLog()
    log.observe(_prefill(0, 1))
    log.observe(_step(1, 1))
    log.observe(replace(_prefill(2, 1), rids=("done",)))
    log.observe(replace(_step(3, 1), rids=("done",), finished=(True,)))
    log.interrupt()
    log.observe(_step(9, 1))  # back on: r0 runs on, two steps later
    assert log.tally("r0") is None and log.get("r0")["steps"] == 2
    assert log.tally("done") == (1, 1, 1, 0)
    log.observe(replace(_prefill(10, 1), rids=("new",)))
    log.observe(replace(_step(11, 1), rids=("new",)))
    assert log.tally("new") == (1, 1, 1, 0)


def test_tally_counts_accepted_drafts_per_step_over_kept_folded_and_shed_rows():
    """The fourth number of a tally: ``records.accepted_drafts`` of each of the request's steps (its
    own non-draft tokens), summed over its kept rows, the steps past ``max_steps`` and the rows shed
    past the budget alike."""
    from sglang_ctxprof.model.records import accepted_drafts

    log = RequestLog(max_steps=3)
    log.observe(_prefill(-1, 4))
    recs = [replace(_step(i, 4), non_draft_tokens=2) for i in range(5)]  # r2 accepts 3: one draft a step
    for rec in recs:
        log.observe(rec)
    want = sum(accepted_drafts(a, 2) for rec in recs for a in rec.accepted[2:3])
    assert log.tally("r2")[3] == want == 5
    log.max_rows = 0
    log.observe(replace(_step(5, 4), non_draft_tokens=2))  # every row shed into the totals
    assert log.get("r2")["step_rows"] == [] and log.tally("r2")[3] == want + 1


def test_a_client_rid_shaped_like_an_earlier_uses_key_is_a_request_of_its_own():
    """An earlier use of a rid is kept under a key no client rid can equal: a rid that spells the
    old string key (the rid, NUL, the use) neither overwrites that use nor sends a lookup round."""
    log = RequestLog()
    log.observe(_prefill(0, 1))
    fin = replace(_step(1, 1), finished=(True,))
    log.observe(fin)
    log.observe(_prefill(2, 1))  # r0 used again
    log.observe(replace(_prefill(3, 1), rids=("r0\x000",)))
    assert len(log) == 3
    first = log.finished("r0", fin.end_ns)
    assert first is not None and first["use"] == 0 and first["steps"] == 1
    assert log.get("r0\x000")["use"] == 0 and log.get("r0")["use"] == 1


def test_a_token_decoded_inside_a_mixed_batch_counts_that_steps_time():
    """A running request's decode riding a prefill batch (``accepted`` 1 in a prefill record): its
    token and the step's time both go to its decode rate, no prefill time."""
    log = RequestLog()
    log.observe(_prefill(0, 1))
    log.observe(_step(1, 1))
    one = log.get("r0")
    mixed = replace(_prefill(2, 2, committed=1), rids=("r0", "new"), accepted=(1, 0), committed=(1, 0))
    log.observe(mixed)
    r = log.get("r0")
    assert r["committed"] == one["committed"] + 1 and r["prefill_ms"] == one["prefill_ms"]
    assert r["decode_ms"] == one["decode_ms"] + mixed.step_ms and r["retractions"] == 0


def test_a_request_that_ended_unseen_is_not_merged_with_the_next_use_of_its_rid():
    """Profiling off while a request ended (no step said so), then its rid comes again: the new
    request's first prefill (no output before it) starts a use of its own; a retracted request's
    re-prefill (prompt + output) or a prompt's next chunk does not."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    log.observe(_step(1, 1))
    log.interrupt()  # off: r0 ends unseen
    fresh = replace(_prefill(5, 1), ctx_lens=(7000,), prompt_lens=(7000,))
    log.observe(fresh)
    log.observe(replace(fresh, step_id=6))  # its next chunk
    log.observe(_step(7, 1))
    r = log.get("r0")
    assert (r["use"], r["prompt_tokens"], r["steps"], r["partial"]) == (1, 7000, 1, False)
    assert log.tally("r0") == (1, 1, 1, 0)
    log.interrupt()
    log.observe(replace(fresh, step_id=8, ctx_lens=(7004,), committed=(1,)))  # retracted: its re-prefill
    assert log.get("r0")["use"] == 1 and log.get("r0")["retractions"] == 1


def test_a_request_counts_sglangs_retractions_also_one_that_appended_no_token():
    """A prefill row carries SGLang's new retractions of its request: one that hit the request's
    prefill in flight is prefilled again with no output (no token) and still counts."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,), retractions=(1,)))
    log.observe(_step(1, 1))
    log.observe(replace(_prefill(2, 1), ctx_lens=(101,), prompt_lens=(100,), committed=(1,), retractions=(1,)))
    r = log.get("r0")
    assert (r["retractions"], r["use"], r["committed"]) == (2, 0, 2)


def test_a_request_aborted_between_chunks_while_off_is_not_merged_with_the_next_use():
    """It never decoded, but the next request under its rid has another prompt: a use of its own."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,)))  # its first chunk
    log.interrupt()  # off: it is aborted unseen
    log.observe(replace(_prefill(5, 1), ctx_lens=(7000,), prompt_lens=(7000,)))
    r = log.get("r0")
    assert (r["use"], r["prompt_tokens"], r["partial"]) == (1, 7000, False)


def test_a_retraction_that_drops_the_output_leaves_the_request_partial():
    """SGLang drops an ``input_embeds`` request's output at a retraction: its re-prefill has no output
    (the prompt alone), and its completion_tokens count from there.  The tokens the history holds are
    not SGLang's count any more: the request is partial (checked against no books)."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    log.observe(_step(1, 1))
    log.observe(replace(_prefill(2, 1), ctx_lens=(100,), prompt_lens=(100,), retractions=(1,)))
    r = log.get("r0")
    assert r["retractions"] == 1 and r["use"] == 0 and r["partial"]
    assert log.tally("r0") is None
    kept = RequestLog()  # output kept (prompt + output prefilled again): whole
    kept.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    kept.observe(_step(1, 1))
    kept.observe(replace(_prefill(2, 1), ctx_lens=(102,), prompt_lens=(100,), committed=(1,), retractions=(1,)))
    assert not kept.get("r0")["partial"] and kept.tally("r0") is not None


def test_a_chunked_re_prefill_that_dropped_the_output_stays_one_partial_request():
    """The same, prefilled again in two chunks (a prompt over the chunk size): the second chunk
    carries no retraction and looks like a first prefill of the prompt, but nothing was decoded
    since the first chunk, so it is the same request, not a new one under its rid; it finishes,
    partial, and the self-audit checks it against nothing (SGLang's books count all its verifies)."""
    agg = Aggregator()
    agg.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    agg.observe(_step(1, 1))
    agg.observe(_step(2, 1))
    agg.observe(replace(_prefill(3, 1), prompt_lens=(100,), retractions=(1,)))  # chunk 1: output dropped
    agg.observe(replace(_prefill(4, 1), prompt_lens=(100,)))  # chunk 2
    agg.observe(replace(_step(5, 1, fin_last=True), books=((3, 6, 5),)))
    uses = agg.requests.totals()
    assert [(r["use"], r["steps"], r["retractions"], r["finished"], r["partial"]) for r in uses] == [
        (0, 3, 1, True, True)]
    assert not any(agg.audit.status()["violations"].values())


def test_a_rid_used_again_with_another_prompt_is_a_new_request_even_if_its_first_row_was_retracted():
    """A use that ended unseen (its last step lost), then the rid again with another prompt whose
    first prefill SGLang retracted in flight (the retraction rides its next row): a retraction never
    changes the prompt, so this is a new request, not the old one prefilled again."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    log.observe(_step(1, 1))
    log.interrupt()
    log.observe(replace(_prefill(2, 1), ctx_lens=(150,), prompt_lens=(150,), retractions=(1,)))
    log.observe(_step(3, 1, fin_last=True))
    assert [(r["use"], r["prompt_tokens"], r["retractions"]) for r in log.totals()] == [(0, 100, 0), (1, 150, 1)]


def test_an_entry_of_unknown_prompt_retracted_without_its_output_stays_one_request():
    """An entry first made by a decode step (the history reset while the request ran) knows no
    prompt; its re-prefill after a retraction that dropped the output is the prompt alone, and a
    retraction never starts a new request: one use, partial, no false alarm from the audit."""
    agg = Aggregator()
    agg.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    agg.observe(_step(1, 1))
    agg.reset()
    for rec in (_step(2, 1), _step(3, 1), replace(_prefill(4, 1), prompt_lens=(100,), retractions=(1,)),
                _step(5, 1), replace(_step(6, 1, fin_last=True), books=((5, 3, 0),))):
        agg.observe(rec)
    assert [(r["use"], r["steps"], r["retractions"], r["finished"], r["partial"]) for r in agg.requests.totals()] == [
        (0, 4, 1, True, True)]
    assert not any(agg.audit.status()["violations"].values())


def test_a_decode_row_riding_a_mixed_batch_is_decoding_for_the_end_unseen():
    """A partial request whose latest row was a decode row in a mixed prefill batch, then unseen to
    its end, and the rid again with the same prompt: it decoded since its latest prefill, so the new
    prefill is a new request."""
    log = RequestLog()
    log.observe(replace(_prefill(0, 1), prompt_lens=(100,)))
    log.observe(_step(1, 1))
    log.interrupt()
    log.observe(_step(2, 1))
    log.observe(replace(_prefill(3, 2, committed=1), rids=("r0", "other"), accepted=(1, 0), committed=(1, 0),
                        ctx_lens=(103, 50), prompt_lens=(100, 50)))
    log.interrupt()
    log.observe(replace(_prefill(9, 1), prompt_lens=(100,)))
    log.observe(_step(10, 1))
    assert [(r["use"], r["steps"]) for r in log.totals() if r["rid"] == "r0"] == [(0, 2), (1, 1)]


def test_a_request_that_keeps_no_output_exports_no_token():
    """``max_new_tokens=0`` (and each n>1 request's hidden warm-up) finishes at its prefill with
    SGLang's ``completion_tokens`` 0, where ``max_new_tokens=1`` has 1: the books tell them apart,
    and the exported ``gen_ai.usage.output_tokens`` (``output_tokens``) follows them."""
    from sglang_ctxprof.aggregate.request_entry import output_tokens

    log = RequestLog()
    for rid, out in (("zero", 0), ("one", 1)):
        log.observe(StepRecord(step_id=1, kind="prefill", algorithm="EAGLE", rank=RankId(), rids=(rid,),
                               ctx_lens=(50,), accepted=(0,), committed=(0,), finished=(True,), draft_tokens=0,
                               step_ms=20.0, books=((-1, out, -1),)))
    assert output_tokens(log.get("zero")) == 0 and output_tokens(log.get("one")) == 1
    assert (log.get("zero")["completion_tokens"], log.get("one")["committed"]) == (0, 0)  # SGLang's count, beside ours
