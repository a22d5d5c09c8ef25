"""The one phase layout (model/layout.py) that the trace export and the OTel spans draw."""

from __future__ import annotations

from sglang_ctxprof.model.layout import PhaseSlice, lay_phases
from sglang_ctxprof.model.records import step_end_ns

T = 10**9


def test_top_phases_tile_the_step_and_a_split_tiles_its_forward():
    ph = {"draft": 1.1111111, "verify": 3.3333333, "verify_attn": 1.2222222, "verify_moe": 1.0000001,
          "verify_rest": 1.111111, "draft_extend": 0.5555555, "overhead": 0.0000004}
    end = step_end_ns(T, sum(ph[p] for p in ("draft", "verify", "draft_extend", "overhead")))
    got = lay_phases(ph, T, end)
    top = [s for s in got if not s.parent]
    assert [s.name for s in top] == ["draft", "verify", "draft_extend"]  # under 1 ns: left out
    assert top[0].start_ns == T and top[-1].end_ns == end
    assert all(a.end_ns == b.start_ns for a, b in zip(top, top[1:]))
    kids = [s for s in got if s.parent == "verify"]
    verify = top[1]
    assert [k.name for k in kids] == ["verify_attn", "verify_moe", "verify_rest"]
    assert kids[0].start_ns == verify.start_ns and kids[-1].end_ns == verify.end_ns
    assert all(a.end_ns == b.start_ns for a, b in zip(kids, kids[1:]))
    assert got.index(verify) < got.index(kids[0])  # a parent comes before its children


def test_plain_decode_split_and_clamping_to_the_step():
    ph = {"decode": 2.0, "decode_attn": 1.5, "decode_rest": 0.5, "unattributed": 9.0}
    got = lay_phases(ph, T, T + 4 * 10**6)  # phases longer than the step: clamped at its end
    assert got == [PhaseSlice("decode", "", T, T + 2 * 10**6),
                   PhaseSlice("decode_attn", "decode", T, T + 1_500_000),
                   PhaseSlice("decode_rest", "decode", T + 1_500_000, T + 2 * 10**6),
                   PhaseSlice("unattributed", "", T + 2 * 10**6, T + 4 * 10**6)]
