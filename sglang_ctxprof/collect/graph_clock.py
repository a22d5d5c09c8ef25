"""Attention / MoE split of verify under CUDA graphs: external events, sampled reads.

A Python hook inside the model does not run when a CUDA graph is replayed, so block timing under
graphs is done at *capture* time (sglang-internals.md section 5, "Timing layers under CUDA graphs"):

1. **Capture.**  While a graph backend captures a shape (``capture_begin(key)`` ..
   ``capture_end(key)``, keyed per graph: ``(id(backend), shape_key)``) and the stream really is
   capturing (the two eager warm-ups are skipped), each outermost attention / MoE block is wrapped
   in a pair of ``Event(enable_timing=True, external=True)`` records.  External records become
   graph nodes, so every replay re-records them; a plain event would not be a timing node.
2. **Replay.**  ``on_replay(key, builder)`` runs before each replay.  If the replay belongs to a
   verify phase of a *sampled* step, the step keeps a handle ``GraphRead(key, generation)``;
   otherwise the step's split is marked unavailable (``False``): never a wrong number.
3. **Sampling.**  A step is sampled when ``step_id % K == 0`` (``step_id`` is SGLang's
   ``forward_ct``, identical on every DP/TP rank, so all ranks agree).  The scheduler processes a
   sampled step's result before it launches the next batch (``hold_overlap``, an AFTER hook on
   ``Scheduler.is_disable_overlap_for_batch``), so the next replay cannot overwrite the events
   before they are read.  The read happens in ``process_batch_result`` after SGLang's own
   ``copy_done.synchronize()``; it only uses ``query()``/``elapsed_time()``, never a synchronize.
4. **Guards.**  Every replay bumps a per-graph generation counter; a read whose graph was replayed
   since (the overlap gate did not hold) or whose events are not complete yet is discarded and
   counted, never retried (a later read could see the next replay's times).
5. **Fallback.**  ``external=`` is feature-detected.  Without it the split is reported unavailable,
   or, with ``fallback="eager"``, sampled steps run eagerly (``force_eager``) so ordinary block
   events measure them.

Imports nothing of SGLang or torch: the event factory and ``is_capturing`` are injected.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Optional

from ..model.names import Phase

logger = logging.getLogger(__name__)

_VERIFY = Phase.VERIFY.value
FALLBACKS = ("off", "eager")
MAX_EVENTS = 200_000  # bound on events held by captured graphs (2 per block per graph)


def external_event_factory(event_cls: Any) -> tuple[Optional[Callable[[], Any]], str]:
    """Feature-detect ``event_cls(enable_timing=True, external=True)``: (factory or None, reason)."""
    try:
        event_cls(enable_timing=True, external=True)
    except TypeError:
        return None, "this PyTorch has no Event(external=True); CUDA-graph block timing unavailable"
    except Exception as exc:  # noqa: BLE001 - e.g. no device: report, never break start-up
        return None, f"external events unusable: {type(exc).__name__}: {exc}"
    return (lambda: event_cls(enable_timing=True, external=True)), ""


class GraphRead:
    """A sampled step's claim on one graph's events: valid while that graph is not replayed again."""

    __slots__ = ("key", "gen", "regions")

    def __init__(self, key: Hashable, gen: int, regions: list) -> None:
        self.key = key
        self.gen = gen
        self.regions = regions


class GraphTimer:
    def __init__(self, external_factory: Optional[Callable[[], Any]], is_capturing: Callable[[], bool],
                 sample_every: int = 64, fallback: str = "off", reason: str = "") -> None:
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.factory = external_factory
        self.available = external_factory is not None
        self.reason = reason
        self._is_capturing = is_capturing
        self.sample_every = sample_every
        self.fallback = fallback
        self._sets: dict[Hashable, list[tuple[str, Any, Any]]] = {}
        self._gen: dict[Hashable, int] = {}
        self._capture_key: Optional[Hashable] = None
        self._depth = 0
        self.events = 0
        self.sampled_now = False
        self.sampled_reads = 0
        self.overwritten = 0
        self.unready = 0
        self.unavailable_steps = 0
        self.eager_forced = 0

    # ---- sampling (identical on every rank: derived from the step counter) ---------------------
    def is_sampled(self, step_id: int) -> bool:
        return step_id % self.sample_every == 0

    def begin_step(self, step_id: int) -> None:
        self.sampled_now = self.is_sampled(step_id)

    @property
    def in_use(self) -> bool:
        """True once some graph carries our external events (timing mode ``cuda_graph_events``)."""
        return bool(self._sets)

    def hold_overlap(self, last_step_id: Optional[int]) -> bool:
        """Process the previous (sampled) step before launching the next batch."""
        return last_step_id is not None and self.in_use and self.is_sampled(last_step_id)

    def force_eager(self, builder: Any) -> bool:
        """Eager fallback: run a sampled verify step without its graph so block events time it."""
        if (self.fallback == "eager" and not self.available and self.sampled_now
                and builder is not None and builder.in_phase(_VERIFY)):
            self.eager_forced += 1
            return True
        return False

    # ---- capture ---------------------------------------------------------------------------------
    def capture_begin(self, key: Hashable) -> None:
        self._capture_key = key
        self._depth = 0
        old = self._sets.pop(key, None)
        if old:
            self.events -= 2 * len(old)

    def capture_end(self, key: Hashable) -> None:
        self._capture_key = None
        self._depth = 0

    def capturing(self) -> bool:
        return self._capture_key is not None and self.available and bool(self._is_capturing())

    def region(self, name: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        """Wrap one block during capture with an external event pair (outermost block only)."""
        if self._depth or self.events + 2 > MAX_EVENTS:
            return original(*args, **kwargs)
        key = self._capture_key
        try:
            start = self.factory()
            end = self.factory()
            start.record()
        except Exception as exc:  # noqa: BLE001 - lose the split, never the forward
            self._disable(f"external event record failed: {type(exc).__name__}: {exc}")
            return original(*args, **kwargs)
        self._depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            self._depth -= 1
            try:
                end.record()
                self._sets.setdefault(key, []).append((name, start, end))
                self.events += 2
            except Exception as exc:  # noqa: BLE001
                self._disable(f"external event record failed: {type(exc).__name__}: {exc}")

    def _disable(self, reason: str) -> None:
        self.available = False
        self.reason = reason
        self._sets.clear()
        self.events = 0
        logger.warning("sglang-ctxprof: %s; the attention/MoE split under CUDA graphs is unavailable", reason)

    # ---- replay ----------------------------------------------------------------------------------
    def on_replay(self, key: Hashable, builder: Any) -> None:
        gen = self._gen[key] = self._gen.get(key, 0) + 1
        if builder is None or not builder.in_phase(_VERIFY):
            return
        regions = self._sets.get(key)
        if not (regions and self.sampled_now and self.available):
            builder.split = False  # this verify ran inside a graph we cannot time on this step
            return
        if builder.split is False:
            return
        reads = builder.split if isinstance(builder.split, list) else []
        reads.append(GraphRead(key, gen, regions))
        builder.split = reads

    # ---- read (process_batch_result, after SGLang's own synchronization) ------------------------
    def read(self, builder: Any) -> None:
        """Turn a step's pending graph reads into ``{phase: ms}`` or ``False``; never waits."""
        reads = builder.split
        if not isinstance(reads, list):
            if reads is False:
                self.unavailable_steps += 1
            return
        sums: dict[str, float] = {}
        for r in reads:
            if self._gen.get(r.key) != r.gen:
                self.overwritten += 1
                builder.split = False
                return
            for name, start, end in r.regions:
                if not (start.query() and end.query()):
                    self.unready += 1
                    builder.split = False
                    return
                sums[name] = sums.get(name, 0.0) + float(start.elapsed_time(end))
        self.sampled_reads += 1
        builder.split = sums

    def describe(self) -> dict[str, Any]:
        if self.in_use:
            mode = "cuda_graph_events"
        elif not self.available and self.fallback == "eager":
            mode = "eager_sampled"
        elif not self.available:
            mode = "unavailable_under_graphs"
        else:
            mode = "block_events"
        return {
            "mode": mode, "sample_every": self.sample_every, "fallback": self.fallback,
            "external_events": self.available, "reason": self.reason or None,
            "graphs": len(self._sets), "events": self.events, "sampled_reads": self.sampled_reads,
            "overwritten": self.overwritten, "unready": self.unready,
            "unavailable_steps": self.unavailable_steps, "eager_forced": self.eager_forced,
        }
