"""The CUDA-graph hooks: timed copies at capture, the replay rule at replay, release at cleanup.

They drive :class:`~sglang_ctxprof.collect.graph_clock.GraphTimer` (whose module docstring says
how the split is measured).  Unlike the step hooks in :mod:`.hooks`, these decide what every rank
*launches*, so:

* they are in the instrumentor's ``control`` group (``adapter.TARGETS``): installed with the
  session and kept while timing is off, so a toggle handled on different steps by different ranks
  cannot split them;
* what they launch reads no per-rank state: not the step builder, the fault guard, a read's
  outcome or the toggle.  ``graph_replay`` launches what ``GraphTimer.rule`` says from the step
  counter and the configuration; ``graph_capture`` captures a copy where the configuration and the
  runner say so; ``graph_eager_fallback`` runs a sampled verify eagerly from the same rule.  Only
  the bookkeeping of this rank's reads (``GraphTimer.on_replay``) looks at this rank's step;
* a failure of that decision's own code (deterministic, so alike on every rank) launches SGLang's
  plain graph, or answers what SGLang answered (``overlap_gate``, ``graph_eager_fallback``), and
  is reported as a ``hooks`` failure.
"""

from __future__ import annotations

import logging

from ..model.names import ENV_GRAPH_TIMED_SHAPES
from . import adapter, hooks
from .graph_clock import EAGER, TIMED

logger = logging.getLogger(__name__)


def graph_runner_capture(original, self, *args, **kwargs):
    """AROUND DecodeCudaGraphRunner.capture: which runner is capturing, for releases whose graph
    backend keeps no reference to its runner (0.5.16's FullCudaGraphBackend)."""
    p = hooks.profiler()
    if p is None:
        return original(self, *args, **kwargs)
    before, p.capture_runner = p.capture_runner, self
    try:
        return original(self, *args, **kwargs)
    finally:
        p.capture_runner = before


def graph_capture(original, self, shape_key, *args, **kwargs):
    """AROUND a graph backend's capture_one.  SGLang's own graph is captured first, untouched.  For
    the target's TARGET_VERIFY graphs the backend then captures a timed copy under a derived key,
    with external events around the attention/MoE blocks, when the configuration selects the shape;
    every rank captures the same copies.  A copy that fails to capture stops the start where the
    graph has peers (they are inside the same capture), and drops every copy on a single rank."""
    out = original(self, shape_key, *args, **kwargs)
    p = hooks.profiler()
    if p is None or adapter.is_timed_shape_key(shape_key):
        return out
    try:
        runner = p.capture_runner
        g = p.ensure_graph() if adapter.is_target_verify_graph(self, runner) else None
        if g is None:
            return out
        refusal = adapter.timed_copy_refusal(self, runner)
        if refusal is not None:
            g.refuse(refusal)
            return out
        if not g.wants_copy(id(self), adapter.shape_size(shape_key)):
            return out
        key = adapter.graph_key(self, shape_key)
        g.track(self)
        g.capture_begin(key)
    except Exception as exc:  # noqa: BLE001 - the same code fails alike on every rank: no copy anywhere
        logger.warning("sglang-ctxprof: no timed copy of %r: %s: %s", shape_key, type(exc).__name__, exc)
        return out
    try:
        original(self, adapter.timed_shape_key(shape_key), *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - SGLang's own graph is captured
        g.capture_end(key, False)
        why = f"timed copy capture failed: {type(exc).__name__}: {exc}"
        if adapter.graph_ranks(self, p.capture_runner) > 1:
            logger.error("sglang-ctxprof: %s", why)
            raise RuntimeError(f"sglang-ctxprof: {why}. The other ranks are capturing the same copy and every "
                               "rank must replay the same graphs, so the start stops here; set "
                               f"{ENV_GRAPH_TIMED_SHAPES}=none to serve without timed copies") from exc
        g.drop_copies(why)
        return out
    g.capture_end(key, True)
    return out


def graph_replay(original, self, shape_key, *args, **kwargs):
    """AROUND a graph replay: launch what ``GraphTimer.rule`` says for this step (the timed copy on
    sampled steps, SGLang's graph otherwise), then note it for this rank's reads."""
    p = hooks.profiler()
    g = p.graph if p is not None else None
    if g is None:
        return original(self, shape_key, *args, **kwargs)
    try:
        key = adapter.graph_key(self, shape_key)
        timed_key = adapter.timed_shape_key(shape_key)
        timed = g.rule(adapter.step_now(p.step_source), key) == TIMED and adapter.has_graph(self, timed_key)
    except Exception as exc:  # noqa: BLE001 - alike on every rank: SGLang's graph
        p.guard.fail("hooks", exc)
        return original(self, shape_key, *args, **kwargs)
    try:
        g.on_replay(key, hooks.recording(p), timed)
    except Exception as exc:  # noqa: BLE001 - only this rank's read is at stake
        p.guard.fail("hooks", exc)
    return original(self, timed_key if timed else shape_key, *args, **kwargs)


def graph_cleanup(original, self, *args, **kwargs):
    """AFTER a graph backend's cleanup (its graphs are reset): release the events they referenced."""
    out = original(self, *args, **kwargs)
    p = hooks.profiler()
    g = p.graph if p is not None else None
    if g is not None:
        try:
            g.release_backend(id(self))
        except Exception as exc:  # noqa: BLE001
            p.guard.fail("hooks", exc)
    return out


def overlap_gate(original, self, batch, last_batch, *args, **kwargs):
    """AFTER Scheduler.is_disable_overlap_for_batch: when the previous and the next step are both
    sampled (K = 1), process the previous one first, so the next timed replay cannot overwrite its
    events before they are read.  Configuration and step ids only: every rank agrees.  A failure of
    that decision answers SGLang's own ``out``."""
    out = original(self, batch, last_batch, *args, **kwargs)
    if out:
        return out
    p = hooks.profiler()
    g = p.graph if p is not None else None
    if g is None:
        return out
    try:
        hold = g.hold_overlap(adapter.batch_step_id(last_batch), adapter.next_step_id(self))
    except Exception as exc:  # noqa: BLE001 - alike on every rank: SGLang's answer
        p.guard.fail("hooks", exc)
        return out
    return True if hold else out


def graph_eager_fallback(original, self, *args, **kwargs):
    """AFTER DecodeCudaGraphRunner.can_run_graph: with fallback=eager and no external events, the
    rule runs the target's verify of a sampled step eagerly on every rank, so plain block events
    time it.  EAGLE asks twice per step (preparing verify, then in the forward): the same step
    gives the same answer."""
    out = original(self, *args, **kwargs)
    if not out:
        return out
    p = hooks.profiler()
    g = p.graph if p is not None else None
    if g is None or g.fallback != "eager":
        return out
    try:
        step = adapter.step_now(p.step_source)
        if not adapter.is_target_verify_runner(self) or g.rule(step) != EAGER:
            return out
        g.count_eager(step)
    except Exception as exc:  # noqa: BLE001 - alike on every rank: SGLang's answer
        p.guard.fail("hooks", exc)
        return out
    return False


HOOKS = {
    "graph_runner_capture": graph_runner_capture,
    "graph_capture": graph_capture,
    "graph_replay": graph_replay,
    "graph_cleanup": graph_cleanup,
    "overlap_gate": overlap_gate,
    "graph_eager_fallback": graph_eager_fallback,
}
