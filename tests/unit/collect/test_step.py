"""``collect/step``: a step's marks resolved into phase milliseconds, its timing label, its release.

Marks are integer nanoseconds on a hand-driven clock whose marks can be held "not ready" (the
device has not reached them), so every phase below is computed by hand: the leaves add up to the
step span exactly, the attention/MoE split is left out (never zero) when it is unavailable, and an
unfinished mark resolves to None, not to a guess.
"""

from __future__ import annotations

import pytest

from sglang_ctxprof.collect.step import SplitState, StepBuilder, release, resolve, timing_label
from sglang_ctxprof.model.names import (TIMING_CPU, TIMING_CUDA_EVENTS, TIMING_CUDA_GRAPH,
                                        TIMING_CUDA_GRAPH_EVENTS)

MS = 1_000_000  # ns


class Clock:
    """elapsed_ms of two integer-ns marks; marks in ``pending`` are not reached yet; counts releases."""

    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.released: list[int] = []

    def elapsed_ms(self, a: int, b: int) -> float | None:
        if a in self.pending or b in self.pending:
            return None
        return (b - a) / MS

    def release(self, token: int) -> None:
        self.released.append(token)


def spec_step() -> StepBuilder:
    """20 ms: draft 0-2 and 2-3 (two calls), verify 3-13 with attention 4-7 and MoE 8-10,
    draft_extend 13-17; 3 ms of the span outside every named phase."""
    b = StepBuilder("decode", 0)
    b.span = (0, 20 * MS)
    b.marks = [("draft", 0, 2 * MS), ("draft", 2 * MS, 3 * MS), ("verify", 3 * MS, 13 * MS),
               ("verify_attn", 4 * MS, 7 * MS), ("verify_moe", 8 * MS, 10 * MS),
               ("draft_extend", 13 * MS, 17 * MS)]
    return b


def leaves(phases: dict[str, float]) -> float:
    return sum(v for k, v in phases.items() if k in ("draft", "verify", "draft_extend", "decode",
                                                    "overhead", "unattributed"))


def test_speculative_step_phases_by_hand():
    step_ms, ph = resolve(spec_step(), Clock(), full_phases=True)
    assert step_ms == 20.0
    assert ph == {"draft": 3.0, "verify": 10.0, "draft_extend": 4.0, "verify_attn": 3.0, "verify_moe": 2.0,
                  "verify_rest": 5.0, "overhead": 3.0}
    assert leaves(ph) == step_ms


def test_unknown_algorithm_calls_the_remainder_unattributed():
    _, ph = resolve(spec_step(), Clock(), full_phases=False)
    assert ph["unattributed"] == 3.0 and "overhead" not in ph


@pytest.mark.parametrize("hold", ["span_end", "verify_end", "attn_start"])
def test_a_mark_the_device_has_not_reached_resolves_to_none(hold):
    b, clock = spec_step(), Clock()
    clock.pending.add({"span_end": 20 * MS, "verify_end": 13 * MS, "attn_start": 4 * MS}[hold])
    assert resolve(b, clock, True) is None
    clock.pending.clear()
    assert resolve(b, clock, True)[0] == 20.0  # the same builder resolves once the device is there


def test_no_span_means_no_step():
    b = spec_step()
    b.span = None
    assert resolve(b, Clock(), True) is None


@pytest.mark.parametrize("state", ["pending", "unavailable"])
def test_unavailable_split_is_left_out_not_zero(state):
    b = spec_step()
    if state == "pending":  # a timed copy's events not read yet
        b.split_pending(object())
    else:  # verify ran in a CUDA graph whose events are not read (unsampled step)
        b.split_unavailable()
    assert b.split is SplitState(state)
    _, ph = resolve(b, Clock(), True)
    assert not {"verify_attn", "verify_moe", "verify_rest"} & set(ph)
    assert ph["verify"] == 10.0 and ph["overhead"] == 3.0


def test_graph_split_adds_to_the_block_marks():
    b = spec_step()
    b.split_read({"verify_attn": 1.5, "verify_moe": 0.5})  # read from a timed graph copy's events
    _, ph = resolve(b, Clock(), True)
    assert (ph["verify_attn"], ph["verify_moe"], ph["verify_rest"]) == (4.5, 2.5, 3.0)


def test_verify_rest_never_goes_negative():
    b = spec_step()
    b.split_read({"verify_attn": 9.0})
    _, ph = resolve(b, Clock(), True)
    assert ph["verify_attn"] == 12.0 and ph["verify_rest"] == 0.0


def test_plain_decode_gets_its_own_split_unless_a_graph_ran():
    b = StepBuilder("decode", 0)
    b.span = (0, 10 * MS)
    b.marks = [("decode", 1 * MS, 9 * MS), ("verify_attn", 2 * MS, 5 * MS), ("verify_moe", 5 * MS, 6 * MS)]
    _, ph = resolve(b, Clock(), True)
    assert ph == {"decode": 8.0, "decode_attn": 3.0, "decode_moe": 1.0, "decode_rest": 4.0, "overhead": 2.0}
    b.graph_ran, b.marks = True, [("decode", 1 * MS, 9 * MS)]  # blocks ran inside the replay: no marks
    _, ph = resolve(b, Clock(), True)
    assert ph == {"decode": 8.0, "overhead": 2.0}


def test_named_phases_longer_than_the_span_stretch_the_step():
    """A clock whose marks are not perfectly nested: the leaves still sum to the reported step."""
    b = StepBuilder("decode", 0)
    b.span = (1 * MS, 10 * MS)
    b.marks = [("draft", 0, 4 * MS), ("verify", 4 * MS, 10 * MS)]
    step_ms, ph = resolve(b, Clock(), True)
    assert step_ms == 10.0 and ph["overhead"] == 0.0 and leaves(ph) == step_ms


def test_a_phase_timed_twice_inside_the_span_is_not_hidden():
    """Marks inside the span whose phases add up to more than it because two marks of one phase overlap
    (a hook firing inside itself): the step stays as measured, so the leaves exceed it and the audit's
    leaf_sum says so."""
    b = StepBuilder("decode", 0)
    b.span = (0, 10 * MS)
    b.marks = [("draft", 1 * MS, 5 * MS), ("draft", 1 * MS, 5 * MS), ("verify", 5 * MS, 9 * MS)]
    step_ms, ph = resolve(b, Clock(), True)
    assert step_ms == 10.0 and ph["draft"] == 8.0 and leaves(ph) == 12.0
    b.marks = [("draft", 0, 5 * MS), ("verify", 5 * MS, 10 * MS + 500)]  # rounding: nanoseconds past it
    step_ms, ph = resolve(b, Clock(), True)
    assert leaves(ph) == step_ms


def test_timing_label_says_what_ran():
    b = StepBuilder("decode", 0)
    assert timing_label(b, TIMING_CPU) == TIMING_CPU
    assert timing_label(b, TIMING_CUDA_EVENTS) == TIMING_CUDA_EVENTS  # eager
    b.split_unavailable()
    assert timing_label(b, TIMING_CUDA_EVENTS) == TIMING_CUDA_GRAPH
    b, b2 = StepBuilder("decode", 0), b
    b.graph_ran = True
    assert timing_label(b, TIMING_CUDA_EVENTS) == TIMING_CUDA_GRAPH
    b.split_read({"verify_attn": 1.0})
    assert timing_label(b, TIMING_CUDA_EVENTS) == TIMING_CUDA_GRAPH_EVENTS
    b2.split_pending(object())  # a pending read cannot undo "unavailable": one unread graph spoils it
    assert b2.split is SplitState.UNAVAILABLE
    assert timing_label(b, TIMING_CPU) == TIMING_CPU  # the CPU clock has no graph to speak of


def test_release_returns_every_mark_once():
    b, clock = spec_step(), Clock()
    release(b, clock)
    tokens = [0, 20 * MS] + [t for _, x, y in b.marks for t in (x, y)]
    assert sorted(clock.released) == sorted(tokens)
    b.span, b.marks, clock.released = None, [], []
    release(b, clock)
    assert clock.released == []


def test_in_phase_reads_the_open_stack():
    b = StepBuilder("decode", 0)
    b.open.append("verify")
    assert b.in_phase("verify") and not b.in_phase("draft")
