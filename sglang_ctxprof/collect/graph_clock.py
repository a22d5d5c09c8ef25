"""Attention / MoE split of verify under CUDA graphs: a timed copy of each verify graph, sampled reads.

A Python hook inside the model does not run when a CUDA graph is replayed, so block timing under
graphs is done at *capture* time (sglang-internals.md section 5, "Timing layers under CUDA graphs"):

1. **Two graphs per verify shape.**  Only the target model's ``TARGET_VERIFY`` graphs are timed
   (``adapter.is_target_verify_graph``), and not a runner whose capture registers state
   (``adapter.timed_copy_refusal``: DSPARK's epilogue would be pointed at the copy's buffers).
   SGLang captures its plain graph first, untouched; then the backend captures a *timed copy* under
   a derived shape key, and while it does each outermost attention / MoE block is wrapped in a pair
   of ``Event(enable_timing=True, external=True)`` records: graph nodes that every replay of the
   copy re-records.  ``timed_shapes`` chooses which shapes get a copy.
2. **What replays: one rule, the same on every rank** (:meth:`GraphTimer.rule`).  SGLang's
   in-graph collectives pair buffers registered at capture across ranks, so every rank must launch
   the same graph on the same step.  The rule reads only the step counter (SGLang's ``forward_ct``,
   advanced once per ``run_batch`` on every TP/DP rank, idle batches included), the configuration,
   and which copies were captured (all-or-nothing, identical on every rank).  It never reads a step
   builder, the fault guard, a read's outcome or the runtime toggle: an idle rank, a rank whose
   hooks failed, and a rank that got ``disable`` first all replay what their peers replay; only
   their reads differ.  The graph hooks stay installed while timing is off, so the rule keeps
   holding; a sampled step then still replays the copy (its event nodes cost ~2-3 us each, on one
   step in K), K = 1 still holds the overlap (``hold_overlap``), and ``fallback="eager"`` still runs
   one verify in K eagerly; ``timed_shapes=none`` makes all of that zero (no copy, no eager step).
3. **Reads are per rank.**  A sampled verify step keeps a handle ``GraphRead(key, generation)``;
   ``read`` turns it into ``{phase: ms}`` after SGLang's own synchronization, with ``query()`` only.
   Every timed replay bumps the copy's generation, so a read whose copy was replayed since, whose
   events are not complete, or that raises is dropped and counted (never retried, never a wrong
   number).  ``_disable`` (a failed record, the event cap) stops reads on this rank, not replays.
   ``hold_overlap`` (an AFTER hook on ``Scheduler.is_disable_overlap_for_batch``) processes a step
   before the next launch when both are sampled (K = 1); configuration and step ids only.
4. **Capture is all-or-nothing across ranks.**  Whether a shape gets a copy depends on the
   configuration and the runner only.  A copy whose capture fails stops the start when the graph
   has peers (they are inside the same capture; going on would desync their collectives, where
   SGLang alone would have failed); on a single rank every copy is dropped and the status says why.
5. **Lifetime.**  A CUDA graph holds no reference to the events recorded in it; this timer is their
   only owner.  An event set is kept while any graph may still replay it: a re-captured shape
   retires its old set, and sets are released when the backend's ``cleanup`` reset its graphs
   (``release_backend``) or the backend itself is gone (a weak reference: a recapture that replaces
   the runner without ``cleanup``).  At ``MAX_EVENTS`` reads stop, with the reason in the status.
6. **Fallback.**  Without ``external=`` the split is unavailable, or, with ``fallback="eager"``,
   the rule runs every rank's sampled verify eagerly (``EAGER``), timed with plain events.

Imports nothing of SGLang or torch: the event factory, ``is_capturing`` and ``memory`` are injected.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, Hashable, Optional

from ..model.names import Phase
from .step import SplitState, StepBuilder

logger = logging.getLogger(__name__)

_VERIFY = Phase.VERIFY.value
FALLBACKS = ("off", "eager")
MAX_EVENTS = 200_000  # bound on events held by captured graphs (2 per block per graph)
TIMED, PLAIN, EAGER = "timed", "plain", "eager"  # what the rule launches


def external_event_factory(event_cls: Any) -> tuple[Optional[Callable[[], Any]], str]:
    """Feature-detect ``event_cls(enable_timing=True, external=True)``: (factory or None, reason)."""
    try:
        event_cls(enable_timing=True, external=True)
    except TypeError:
        return None, "this PyTorch has no Event(external=True); CUDA-graph block timing unavailable"
    except Exception as exc:  # noqa: BLE001 - e.g. no device: report, never break start-up
        return None, f"external events unusable: {type(exc).__name__}: {exc}"
    return (lambda: event_cls(enable_timing=True, external=True)), ""


def shape_selected(spec: str, index: int, size: Optional[int]) -> bool:
    """``timed_shapes`` (``model.config.parse_timed_shapes``) applied to the ``index``-th captured
    shape of a runner, of batch size ``size``."""
    if spec == "all":
        return True
    if spec == "none":
        return False
    if spec.startswith("every:"):
        return index % int(spec[6:]) == 0
    return size is not None and str(size) in spec.split(",")


class GraphRead:
    """A sampled step's claim on one timed copy's events: valid while that copy is not replayed again."""

    __slots__ = ("key", "gen", "regions")

    def __init__(self, key: Hashable, gen: int, regions: list) -> None:
        self.key = key
        self.gen = gen
        self.regions = regions


class GraphTimer:
    def __init__(self, external_factory: Optional[Callable[[], Any]], is_capturing: Callable[[], bool],
                 sample_every: int = 64, fallback: str = "off", reason: str = "", timed_shapes: str = "all",
                 memory: Optional[Callable[[], int]] = None) -> None:
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, got {sample_every}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.factory = external_factory
        self.timed = external_factory is not None  # configuration (feature detection), the same on every rank
        self.reading = self.timed  # this rank reads the copies' events (``_disable`` clears it)
        self.reason = reason
        self._is_capturing = is_capturing
        self._memory = memory
        self.sample_every = sample_every
        self.fallback = fallback
        self.timed_shapes = timed_shapes
        self._copies: set[Hashable] = set()  # keys whose timed copy was captured (identical on every rank)
        self.copies_off: Optional[str] = None  # why no copy replays (all-or-nothing)
        self.refused: dict[str, int] = {}  # why a runner got no copy -> shapes
        self._index: dict[Any, int] = {}  # backend id -> shapes captured so far (``every:N``)
        self._sets: dict[Hashable, list[tuple[str, Any, Any]]] = {}
        self._retired: list[tuple[Hashable, list]] = []  # sets of replaced graphs, until cleanup
        self._gen: dict[Hashable, int] = {}
        self._tracked: set[int] = set()  # backends with a weak-reference finalizer
        self._gone: list[int] = []  # backends garbage-collected, released at the next copy decision or read
        self._capture_key: Optional[Hashable] = None
        self._depth = 0
        self._t0 = 0.0
        self._m0: Optional[int] = None
        self.capture_s = 0.0
        self.capture_bytes: Optional[int] = 0 if memory is not None else None
        self.events = 0
        self.sampled_reads = self.overwritten = self.unready = self.read_errors = 0
        self.unavailable_steps = self.eager_forced = 0
        self.timed_replays = self.plain_replays = 0
        self.released = 0
        self._last_eager: Optional[int] = None
        self.blocks: set[str] = set()  # classes of the blocks wrapped at capture (coverage)

    # ---- the replay rule ----------------------------------------------------------------------------
    def rule(self, step_id: Optional[int], key: Optional[Hashable] = None) -> str:
        """What every rank launches for the target verify of step ``step_id`` (graph ``key``):
        ``TIMED`` (the timed copy), ``PLAIN`` (SGLang's graph) or ``EAGER`` (no graph).

        Inputs: the step counter, the configuration (``sample_every``, ``fallback``, feature
        detection) and the captured copies, which every rank has alike.  Nothing else: no builder,
        guard, read outcome or toggle, so every rank launches the same graph on the same step."""
        if step_id is None or step_id % self.sample_every:
            return PLAIN
        if not self.timed:  # no timed copies: the eager fallback, unless no shape is to be timed
            return EAGER if self.fallback == "eager" and self.timed_shapes != "none" else PLAIN
        return TIMED if key in self._copies else PLAIN

    def hold_overlap(self, last_step_id: Optional[int], next_step_id: int) -> bool:
        """Process the previous step before launching the next one when both are sampled (K = 1):
        only then could the next timed replay overwrite events not read yet; never without a timed
        copy.  Configuration, the copies and step ids only, so every rank agrees."""
        k = self.sample_every
        return (self.timed and bool(self._copies) and last_step_id is not None and last_step_id % k == 0
                and next_step_id % k == 0)

    def count_eager(self, step_id: int) -> None:
        if self._last_eager != step_id:
            self._last_eager = step_id
            self.eager_forced += 1

    @property
    def in_use(self) -> bool:
        """True while verify graphs have timed copies whose events this rank reads."""
        return bool(self._copies) and self.reading

    # ---- capture of a timed copy ------------------------------------------------------------------
    def wants_copy(self, backend_id: Any, size: Optional[int]) -> bool:
        """Whether this newly captured shape gets a timed copy: configuration and capture order only.
        A gone backend is forgotten first: one at its address (CPython reuses ids) starts at index 0."""
        self._release_gone()
        index = self._index[backend_id] = self._index.get(backend_id, -1) + 1
        return self.timed and self.copies_off is None and shape_selected(self.timed_shapes, index, size)

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1

    def track(self, backend: Any) -> None:
        """Release the events of ``backend``'s copies once it is garbage-collected.  A gone backend is
        forgotten first (its finalizer ran before its id could be reused): one at its address gets its own."""
        self._release_gone()
        bid = id(backend)
        if bid not in self._tracked:
            self._tracked.add(bid)
            weakref.finalize(backend, self._gone.append, bid)

    def capture_begin(self, key: Hashable) -> None:
        self._release_gone()
        self._capture_key = key
        self._depth = 0
        old = self._sets.pop(key, None)
        if old:  # the old copy may replay until its backend is cleaned up: keep its events
            self._retired.append((key, old))
        self._t0 = time.perf_counter()
        self._m0 = self._memory() if self._memory is not None else None

    def capture_end(self, key: Hashable, ok: bool) -> None:
        self._capture_key = None
        self._depth = 0
        self.capture_s += time.perf_counter() - self._t0
        if self._memory is not None and self._m0 is not None and self.capture_bytes is not None:
            self.capture_bytes += max(0, self._memory() - self._m0)
        if ok:
            self._copies.add(key)
            return
        failed = self._sets.pop(key, None)
        if failed:
            self._retired.append((key, failed))

    def drop_copies(self, why: str) -> None:
        """All or nothing: no copy replays from now on (this rank has no peers to desync)."""
        self.copies_off = why
        self._copies.clear()
        logger.warning("sglang-ctxprof: %s; every timed copy is dropped: the attention/MoE split under "
                       "CUDA graphs is unavailable (SGLang's own graphs serve as usual)", why)

    def capturing(self) -> bool:
        return self._capture_key is not None and self.reading and bool(self._is_capturing())

    def foreign_capture(self) -> bool:
        """A capture that is not our timed copy is running (a plain mark there would be no timing node)."""
        return self._capture_key is None and bool(self._is_capturing())

    def region(self, name: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        """Wrap one block during capture with an external event pair (outermost block only)."""
        if self._depth:
            return original(*args, **kwargs)
        if self.events + 2 > MAX_EVENTS:
            if self.reading:
                self._disable(f"the timed copies hold MAX_EVENTS={MAX_EVENTS} events")
            return original(*args, **kwargs)
        key, factory = self._capture_key, self.factory
        if factory is None:  # no external events (wants_copy refuses then): lose the split, as a failed record does
            self._disable("external event record failed: no external event factory")
            return original(*args, **kwargs)
        try:
            start = factory()
            end = factory()
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
        """No more reads on this rank; replays follow the rule, and every event stays alive."""
        self.reading = False
        self.reason = reason
        logger.warning("sglang-ctxprof: %s; the attention/MoE split under CUDA graphs is unavailable", reason)

    def release_backend(self, backend_id: int) -> int:
        """The backend reset its graphs (``cleanup``) or is gone: drop the events its graphs referenced."""
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
        self._copies = {k for k in self._copies if _owner(k) != backend_id}
        self._index.pop(backend_id, None)
        self.events -= n
        self.released += n
        return n

    def _release_gone(self) -> None:
        while self._gone:
            bid = self._gone.pop()
            self._tracked.discard(bid)
            self.release_backend(bid)

    # ---- replay and read (this rank's bookkeeping; never changes what replays) ---------------------
    def on_replay(self, key: Hashable, builder: Optional[StepBuilder], timed: bool) -> None:
        """After the rule chose: attach the timed copy's events to a sampled verify step, or mark
        the step's split unknown (it ran in a graph we do not read)."""
        if not timed:
            self.plain_replays += 1
            if builder is not None and builder.in_phase(_VERIFY):
                builder.split_unavailable()
            return
        self.timed_replays += 1
        gen = self._gen[key] = self._gen.get(key, 0) + 1  # also without a reader: older reads are stale
        if builder is None or not builder.in_phase(_VERIFY):
            return
        regions = self._sets.get(key)
        if not (regions and self.reading):
            builder.split_unavailable()
            return
        builder.split_pending(GraphRead(key, gen, regions))

    def read(self, builder: StepBuilder) -> None:
        """Turn a step's pending graph reads into ``{phase: ms}`` or unavailable; never waits or raises."""
        self._release_gone()
        if builder.split is not SplitState.PENDING:
            if builder.split is SplitState.UNAVAILABLE:
                self.unavailable_steps += 1
            return
        reads = builder.split_reads
        builder.split_unavailable()  # unless every read below succeeds
        sums: dict[str, float] = {}
        try:
            for r in reads:
                if self._gen.get(r.key) != r.gen:
                    self.overwritten += 1
                    return
                for name, start, end in r.regions:
                    if not (start.query() and end.query()):
                        self.unready += 1
                        return
                    sums[name] = sums.get(name, 0.0) + float(start.elapsed_time(end))
        except Exception:  # noqa: BLE001 - this step's split is dropped; the profile goes on
            self.read_errors += 1
            return
        self.sampled_reads += 1
        builder.split_read(sums)

    def describe(self) -> dict[str, Any]:
        if self.in_use:
            mode = "cuda_graph_events"
        elif not self.timed and self.fallback == "eager":
            mode = "eager_sampled"
        elif not self.reading or self.copies_off:
            mode = "unavailable_under_graphs"
        else:
            mode = "block_events"
        return {
            "mode": mode, "sample_every": self.sample_every, "fallback": self.fallback,
            "external_events": self.timed, "reading": self.reading,
            "reason": self.copies_off or self.reason or None,
            "replay_rule": f"every rank replays the timed copy on steps where forward_ct % {self.sample_every} == 0",
            "timed_copies": {
                "shapes": len(self._copies), "selection": self.timed_shapes, "off": self.copies_off,
                "refused": [f"{why} ({n} shapes)" for why, n in sorted(self.refused.items())],
                "capture_s": round(self.capture_s, 3), "bytes": self.capture_bytes},
            "graphs": len(self._sets), "events": self.events,
            "retired_sets": len(self._retired), "released_events": self.released,
            "sampled_reads": self.sampled_reads, "overwritten": self.overwritten, "unready": self.unready,
            "read_errors": self.read_errors, "unavailable_steps": self.unavailable_steps,
            "eager_forced": self.eager_forced, "timed_replays": self.timed_replays,
            "plain_replays": self.plain_replays, "blocks": sorted(self.blocks),
        }


def _owner(key: Hashable) -> Any:
    return key[0] if isinstance(key, tuple) and key else None
