"""One fixture snapshot through every renderer: JSON, text, Prometheus and the CLI's ``show``.

The fixture has counts whose means do not round back (7 accepted tokens over 3 request-steps), so
a renderer that rebuilt a count from a rounded mean would show it.  The snapshot and the profile
both survive their builtins round trip (the control channel, the HTTP body) unchanged.
"""

from __future__ import annotations

import argparse
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.aggregate.snapshot import Snapshot, merge
from sglang_ctxprof.cli import show
from sglang_ctxprof.model.buckets import Bucketing
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views import prometheus, text
from sglang_ctxprof.views.profile import Profile, build_profile

PH = {"draft": 1.0, "verify": 3.0, "verify_attn": 2.0, "verify_moe": 0.5, "verify_rest": 0.5,
      "draft_extend": 0.25, "overhead": 0.25}


def _rec(i, ctx, acc, kind="decode", fin=None):
    n = len(ctx)
    return StepRecord(step_id=i, kind=kind, algorithm="EAGLE", rank=RankId(), rids=tuple(f"r{j}" for j in range(n)),
                      ctx_lens=tuple(ctx), accepted=tuple(acc), committed=tuple(max(0, a - 1) for a in acc),
                      finished=tuple(fin or (False,) * n), draft_tokens=4, step_ms=4.5 if kind == "decode" else 20.0,
                      phases_ms=PH if kind == "decode" else {}, t_start_ns=10**15 + i)


def fixture_snapshot() -> Snapshot:
    agg = Aggregator(Bucketing.parse("pow2"))
    agg.observe(_rec(0, [100], [1], kind="prefill"))
    agg.observe(_rec(1, [100], [3]))
    agg.observe(_rec(2, [101, 110], [2, 2]))   # bucket 64-127: 3 request-steps, 7 accepted
    agg.observe(_rec(3, [3000], [4]))
    agg.observe(_rec(4, [3004], [1]))          # bucket 2048-4095: 2 request-steps, 5 accepted
    return Snapshot.from_dict(json.loads(json.dumps(agg.state(with_request_steps=True))))


@pytest.fixture
def profile() -> Profile:
    return build_profile(fixture_snapshot()).served(enabled=True, ranks=({"status": {"enabled": True}},))


def _json(p: Profile) -> str:
    return json.dumps(p.to_dict())


def _show(p: Profile, monkeypatch, capsys) -> str:
    body = json.loads(_json(p))  # the server's answer, as the CLI receives it
    monkeypatch.setattr(show, "fetch", lambda url, api_key=None, timeout=30.0: body)
    assert show.run(argparse.Namespace(url="http://x", api_key=None, json=False)) == 0
    return capsys.readouterr().out


def _check_json(out: str, p: Profile) -> None:
    body = json.loads(out)
    assert [(b["label"], b["steps"], b["req_steps"], b["accepted"], b["committed"]) for b in body["buckets"]] == [
        ("64-127", 2, 3, 7, 4), ("2048-4095", 2, 2, 5, 3)]
    assert body["buckets"][0]["accepted_per_step"] == pytest.approx(7 / 3)
    assert Profile.from_dict(body) == p  # nothing lost on the way through JSON
    assert body["totals"] == {"records": 5, "decode_steps": 4, "prefill_batches": 1, "accepted": 12,
                              "committed": 7, "retractions": 0, "requests_tracked": 2, "requests_evicted": 0,
                              "requests_aborted": 0, "requests_aborted_retracted": 0}


def _check_text(out: str, p: Profile) -> None:
    decode = out.split("decode steps by context bucket")[1].split("\n\n")[0]
    rows = {ln.split()[0]: ln.split() for ln in decode.splitlines() if ln.strip()[:1].isdigit()}
    assert rows["64-127"][1:4] == ["2", "1.5", "2.33"] and rows["2048-4095"][1:4] == ["2", "1.0", "2.50"]
    assert "prefill batches" in out and "enabled=True  ranks=1" in out


def _check_prometheus(out: str, p: Profile) -> None:
    fam = {f.name: f for f in text_string_to_metric_families(out)}
    acc = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_accepted_tokens"].samples}
    assert acc == {"64-127": 7, "2048-4095": 5}
    steps = {s.labels["ctx_bucket"]: s.value for s in fam["sglang_ctxprof_steps"].samples}
    assert steps == {"64-127": 2, "2048-4095": 2}
    cnt = {(s.labels["phase"], s.labels["ctx_bucket"]): s.value
           for s in fam["sglang_ctxprof_phase_seconds"].samples if s.name.endswith("_count")}
    assert cnt[("verify_attn", "64-127")] == 2
    sums = {(s.labels["phase"], s.labels["ctx_bucket"]): s.value
            for s in fam["sglang_ctxprof_phase_seconds"].samples if s.name.endswith("_sum")}
    assert sums[("step", "2048-4095")] == pytest.approx(2 * 4.5e-3)


RENDERERS = {
    "json": (_json, _check_json),
    "text": (text.render, _check_text),
    "prometheus": (prometheus.render, _check_prometheus),
    "show": (_show, _check_text),
}


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_every_renderer_shows_the_exact_counts(name, profile, capsys, monkeypatch):
    render, check = RENDERERS[name]
    if name == "show":
        out = render(profile, monkeypatch, capsys)
        assert out == text.render(profile)  # the CLI shows what the server's text format shows
    else:
        out = render(profile)
    check(out, profile)


def test_snapshot_round_trip_and_merge_are_exact():
    snap = fixture_snapshot()
    assert Snapshot.from_dict(snap.to_dict()).to_dict() == snap.to_dict()
    twice = merge([snap, snap])
    b = twice.decode[1]
    assert (b.steps, b.req_steps, b.accepted, b.committed, b.ctx_sum) == (4, 6, 14, 8, 2 * 311)
    assert b.phases["step"].count == 4 and len(twice.requests) == 4


def test_a_body_without_exact_counts_still_loads():
    body = build_profile(fixture_snapshot()).to_dict()
    for b in body["buckets"]:
        for k in ("req_steps", "accepted", "committed", "draft_tokens", "ctx_sum"):
            del b[k]
    old = Profile.from_dict(body)
    assert [(b.req_steps, b.accepted, b.committed) for b in old.buckets] == [(3, 7, 4), (2, 5, 3)]


def test_bad_state_and_body_are_clear_errors():
    with pytest.raises(ValueError, match="not a ctx profile state"):
        Snapshot.from_dict({"decode": {}})
    with pytest.raises(ValueError, match="not a ctx profile body"):
        Profile.from_dict({"buckets": [{"label": "x"}]})
