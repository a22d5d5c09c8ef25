"""``collect/graph_clock``: which shapes get a timed copy, and the replay rule's inputs."""

from __future__ import annotations

import pytest

from graph_rig import build, cleanup  # noqa: F401 - fixture and builder
from sglang_ctxprof.collect.graph_clock import EAGER, PLAIN, TIMED, GraphTimer, shape_selected
from sglang_ctxprof.collect.step import StepBuilder
from sglang_ctxprof.model.config import CtxProfConfig, parse_timed_shapes


@pytest.mark.parametrize("raw,norm", [("all", "all"), (" None ", "none"), ("every:3", "every:3"),
                                      ("32, 1,8", "1,8,32")])
def test_timed_shapes_parse(raw, norm):
    assert parse_timed_shapes("X", raw) == norm


@pytest.mark.parametrize("raw", ["every:0", "some", "0,4", "every:x"])
def test_bad_timed_shapes_name_the_variable(raw):
    with pytest.raises(ValueError, match="SGLANG_CTXPROF_GRAPH_TIMED_SHAPES"):
        CtxProfConfig.from_env({"SGLANG_CTXPROF_GRAPH_TIMED_SHAPES": raw})


def test_shape_selection():
    assert [i for i in range(6) if shape_selected("every:2", i, None)] == [0, 2, 4]
    assert [s for s in (1, 2, 8, 16) if shape_selected("1,8", 0, s)] == [1, 8]
    assert not shape_selected("none", 0, 1) and shape_selected("all", 5, None)
    assert not shape_selected("1,8", 0, None)  # a shape whose size is unknown is not listed


def test_the_rule_reads_the_step_counter_and_configuration_only():
    g = GraphTimer(lambda: None, lambda: False, sample_every=4)
    g._copies.add("k")
    assert [g.rule(s, "k") for s in (None, 1, 4, 8)] == [PLAIN, PLAIN, TIMED, TIMED]
    assert g.rule(4, "other") == PLAIN  # no copy of that shape
    g._disable("reads off on this rank")
    assert g.rule(4, "k") == TIMED  # a rank that stopped reading still replays what its peers replay
    eager = GraphTimer(None, lambda: False, sample_every=4, fallback="eager")
    assert [eager.rule(s) for s in (3, 4)] == [PLAIN, EAGER]


def test_a_shape_left_out_replays_the_plain_graph(monkeypatch, cleanup):
    p, inst, sched = build(monkeypatch)
    cleanup.append((p, inst))
    p.graph.timed_shapes = "none"
    target = sched.model_worker.target
    target.backend.capture_one("bs2", target.run_once)
    copies = p.status()["split"]["timed_copies"]
    assert copies["shapes"] == 1 and copies["selection"] == "none"  # bs1 from before, no bs2
    assert not any(isinstance(k, tuple) and k[1] == "bs2" for k in target.backend._graphs)


class Backend:
    """A graph backend: only its identity matters to the timer (``id`` keys its shapes and events)."""


class Event:
    """An external event: the capture of a timed copy records it."""

    def record(self) -> None:
        return None


def test_a_backend_at_a_freed_backends_address_starts_afresh(monkeypatch):
    """CPython reuses a freed object's id: a new backend there gets its own shape index (a
    selection that depended on when the old one was collected could differ across ranks) and its
    own finalizer (its events are released once it is gone)."""
    import sglang_ctxprof.collect.graph_clock as graph_clock

    g = GraphTimer(Event, lambda: True, timed_shapes="every:2")
    old = Backend()
    bid = id(old)
    g.track(old)
    assert g.wants_copy(bid, 1)  # its first shape (index 0); a second (index 1) would not be timed
    del old  # its finalizer has run: the id is free for the next object
    monkeypatch.setattr(graph_clock, "id", lambda obj: bid, raising=False)  # ... and the next backend gets it
    new = Backend()
    assert g.wants_copy(bid, 1)  # its own first shape: index 0 again
    g.track(new)
    g.capture_begin((bid, "bs1"))
    g.region("Attn", lambda: None, (), {})
    g.capture_end((bid, "bs1"), True)
    assert g.events == 2 and g.rule(0, (bid, "bs1")) == "timed"
    del new
    g.read(StepBuilder("decode", 0))  # the next read releases a gone backend's events
    assert g.events == 0 and g.released == 2 and g.rule(0, (bid, "bs1")) == "plain"


def test_timed_shapes_none_costs_nothing_on_any_step():
    """``timed_shapes=none`` is the documented way to zero the graph timing's cost (its rule keeps
    holding while profiling is off, so ranks agree): no timed copy, so no overlap hold at K = 1, and
    no eager verify from the eager fallback."""
    k1 = GraphTimer(lambda: None, lambda: False, sample_every=1, timed_shapes="none")
    assert not any(k1.hold_overlap(s, s + 1) for s in range(100))
    held = GraphTimer(lambda: None, lambda: False, sample_every=1)
    held._copies.add("k")
    assert all(held.hold_overlap(s, s + 1) for s in range(100))  # with a copy at K = 1 it holds, as before
    eager = GraphTimer(None, lambda: False, sample_every=4, fallback="eager", timed_shapes="none")
    assert {eager.rule(s) for s in range(100)} == {PLAIN}
