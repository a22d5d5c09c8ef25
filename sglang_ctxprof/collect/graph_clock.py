"""Attention / MoE split of verify under CUDA graphs: a timed copy of each verify graph, sampled reads.

A Python hook inside the model does not run when a CUDA graph is replayed, so block timing under
graphs is done at *capture* time (sglang-internals.md section 5, "Timing layers under CUDA graphs"):

1. **Two graphs per verify shape.**  Only the target model's ``TARGET_VERIFY`` graphs are timed
   (``adapter.is_target_verify_graph``); draft, draft-extend and prefill graphs are left alone.  SGLang
   captures its plain graph first, untouched.  Then the backend captures a *timed copy* under a
   derived shape key (``adapter.timed_shape_key``), and while it does (``capture_begin(key)`` ..
   ``capture_end(key)``) each outermost attention / MoE block is wrapped in a pair of
   ``Event(enable_timing=True, external=True)`` records.  External records become graph nodes, so
   every replay of the copy re-records them; a plain event would not be a timing node.
2. **Replay.**  ``on_replay(key, builder, timed)`` runs before each replay and says which graph to
   launch: the timed copy for a verify phase of a *sampled* step (the step keeps a handle
   ``GraphRead(key, generation)``), the plain graph otherwise (the step's split is then ``False``:
   unknown, never a wrong number).  Unsampled replays and everything after ``disable`` (the hooks
   are gone) run the plain graph: they pay nothing for the events.
3. **Sampling.**  A step is sampled when ``step_id % K == 0`` (``step_id`` is SGLang's
   ``forward_ct``, identical on every DP/TP rank).  Only sampled steps replay a timed copy, so a
   copy's events can be overwritten before they are read only when two consecutive steps are
   sampled (K = 1).  For that case ``hold_overlap`` (an AFTER hook on
   ``Scheduler.is_disable_overlap_for_batch``) processes the step before the next launch.  Its answer
   depends on the configuration and the step ids only, so every DP rank agrees.
4. **Guards.**  Every timed replay bumps a per-graph generation counter; a read whose copy was
   replayed since, or whose events are not both complete, is discarded and counted (never retried).
5. **Lifetime.**  A CUDA graph holds no reference to the events recorded in it; this timer is their
   only owner.  An event set is kept while any graph may still replay it: a re-captured shape
   retires its old set, and sets are released only when the backend's ``cleanup`` has reset its
   graphs (``release_backend``).  ``_disable`` stops new timed replays and keeps every event.
6. **Fallback.**  ``external=`` is feature-detected.  Without it the split is reported unavailable,
   or, with ``fallback="eager"``, sampled steps run their verify eagerly (``force_eager``), decided
   once per step so SGLang's two ``can_run_graph`` calls of an EAGLE step agree.

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
    """A sampled step's claim on one timed copy's events: valid while that copy is not replayed again."""

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
        self.timed = self.available  # configuration (feature detection), fixed: the overlap gate reads it
        self.reason = reason
        self._is_capturing = is_capturing
        self.sample_every = sample_every
        self.fallback = fallback
        self._sets: dict[Hashable, list[tuple[str, Any, Any]]] = {}
        self._retired: list[tuple[Hashable, list]] = []  # sets of replaced graphs, until cleanup
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
        self.timed_replays = 0
        self.plain_replays = 0
        self.released = 0
        self.blocks: set[str] = set()  # classes of the blocks wrapped at capture (coverage)

    # ---- sampling (identical on every rank: derived from the step counter) ---------------------
    def is_sampled(self, step_id: int) -> bool:
        return step_id % self.sample_every == 0

    def begin_step(self, step_id: int) -> None:
        self.sampled_now = self.is_sampled(step_id)

    @property
    def in_use(self) -> bool:
        """True once some verify graph has a timed copy carrying our external events."""
        return bool(self._sets)

    def hold_overlap(self, last_step_id: Optional[int], next_step_id: int) -> bool:
        """Process the previous step before launching the next one when both are sampled (K = 1):
        only then could the next timed replay overwrite events not read yet.  Configuration and step
        ids only, so every rank agrees."""
        return (self.timed and last_step_id is not None and self.is_sampled(last_step_id)
                and self.is_sampled(next_step_id))

    def force_eager(self, builder: Any) -> bool:
        """Eager fallback for a sampled step's target verify, decided once per step (every
        ``can_run_graph`` call of the step gets the same answer)."""
        if builder is None:
            return False
        if builder.eager is None:
            builder.eager = self.fallback == "eager" and not self.available and self.sampled_now
            if builder.eager:
                self.eager_forced += 1
        return builder.eager

    # ---- capture of a timed copy ------------------------------------------------------------------
    def capture_begin(self, key: Hashable) -> None:
        self._capture_key = key
        self._depth = 0
        old = self._sets.pop(key, None)
        if old:  # the old copy may replay until its backend is cleaned up: keep its events
            self._retired.append((key, old))

    def capture_end(self, key: Hashable, ok: bool = True) -> None:
        self._capture_key = None
        self._depth = 0
        if not ok:
            failed = self._sets.pop(key, None)
            if failed:
                self._retired.append((key, failed))

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
                if args:
                    self.blocks.add(type(args[0]).__name__)
            except Exception as exc:  # noqa: BLE001
                self._disable(f"external event record failed: {type(exc).__name__}: {exc}")

    def _disable(self, reason: str) -> None:
        """No more timed replays; every event stays alive (a captured graph may still reference it)."""
        self.available = False
        self.reason = reason
        logger.warning("sglang-ctxprof: %s; the attention/MoE split under CUDA graphs is unavailable", reason)

    def release_backend(self, backend_id: int) -> int:
        """The backend reset its graphs (``cleanup``): drop the events its graphs referenced."""
        n = 0
        for key in [k for k in self._sets if _owner(k) == backend_id]:
            n += 2 * len(self._sets.pop(key))
            self._gen.pop(key, None)
        keep = []
        for key, regions in self._retired:
            if _owner(key) == backend_id:
                n += 2 * len(regions)
            else:
                keep.append((key, regions))
        self._retired = keep
        self.events -= n
        self.released += n
        return n

    # ---- replay ----------------------------------------------------------------------------------
    def on_replay(self, key: Hashable, builder: Any, timed: bool) -> bool:
        """Before a replay: True to launch the timed copy of ``key`` (a sampled verify step whose
        copy exists, ``timed``), False for the plain graph."""
        in_verify = builder is not None and builder.in_phase(_VERIFY)
        regions = self._sets.get(key)
        if not (in_verify and timed and regions and self.sampled_now and self.available
                and builder.split is not False):
            if in_verify:
                builder.split = False  # verify ran in a graph we do not time on this step
            self.plain_replays += 1
            return False
        gen = self._gen[key] = self._gen.get(key, 0) + 1
        reads = builder.split if isinstance(builder.split, list) else []
        reads.append(GraphRead(key, gen, regions))
        builder.split = reads
        self.timed_replays += 1
        return True

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
        builder.graph_split = True

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
            "graphs": len(self._sets), "timed_copies": len(self._sets), "events": self.events,
            "retired_sets": len(self._retired), "released_events": self.released,
            "sampled_reads": self.sampled_reads, "overwritten": self.overwritten, "unready": self.unready,
            "unavailable_steps": self.unavailable_steps, "eager_forced": self.eager_forced,
            "timed_replays": self.timed_replays, "plain_replays": self.plain_replays,
            "blocks": sorted(self.blocks),
        }


def _owner(key: Hashable) -> Any:
    return key[0] if isinstance(key, tuple) and key else None
