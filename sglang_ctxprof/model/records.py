"""Typed, immutable records that cross every boundary of the data path.

A :class:`StepRecord` is what the hooks produce for one scheduler step (a speculative decode step
or a prefill/extend batch) once its timings and acceptance are known.  It serialises to builtins
(``to_dict``/``from_dict``) so it can travel through SGLang's msgpack control channel, be written
to disk and be read back by the CLI.  Both are derived from the dataclass fields (``_SHAPE``): a
new field travels once its type has a codec in ``_CODECS``.

The facts every view derives from a step are computed here once: where it ends (``step_end_ns``;
``host_end_ns`` for the scheduler's clock), the drafts each request had accepted
(``accepted_drafts``) and the phases that add up to it (``leaf_phases``, ``leaf_ms``).

Accounting rule (documented in docs/measurement.md): for a request, ``1 + sum(committed)`` equals SGLang's
``completion_tokens`` (the first token comes from prefill), the number of decode records equals
``meta_info.spec_verify_ct``, and ``sum(accepted) - sum(committed)``, plus one per retraction (a
retracted request's re-prefill commits one token with none accepted), is what SGLang dropped at the
request's last step (``max_new_tokens`` or a stop condition).

Imports nothing from SGLang, torch or OTel.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from .names import (ABORT_QUEUED, ABORT_RETRACTED, FORWARD_SPLIT, KIND_DECODE, KIND_PREFILL, LEAF_PHASES,
                    REPORTED_PHASES, Phase)


def _same(v: Any) -> Any:
    return v


_STEP = Phase.STEP.value
SHAPES_KEPT = 256  # shapes of ``phases_ms`` a caller's cache keeps (``StepRecord.reported_phases``)
# keys of a ``phases_ms`` -> (its reported names, the step first; a getter of the others' values)
PhaseShapes = dict[tuple[str, ...], tuple[tuple[str, ...], Callable[[Mapping[str, float]], tuple]]]
assert REPORTED_PHASES[0] == _STEP  # reported_phases puts the step first


def _phase_shape(ph: Mapping[str, float]) -> tuple[tuple[str, ...], Callable[[Mapping[str, float]], tuple]]:
    """The reported names of a ``phases_ms`` of this shape (step first) and a getter of the values of
    those after the step, as a tuple (``itemgetter`` gives a bare value for one name)."""
    rest = tuple(n for n in REPORTED_PHASES if n != _STEP and n in ph)
    if len(rest) > 1:
        get: Callable[[Mapping[str, float]], tuple] = itemgetter(*rest)
    elif rest:
        get = lambda d, n=rest[0]: (d[n],)  # noqa: E731
    else:
        get = lambda d: ()  # noqa: E731
    return (_STEP, *rest), get


# ---- the facts every view derives from a step the same way ----------------------------------------
def ms_to_ns(ms: float) -> int:
    """A measured duration in milliseconds as whole nanoseconds (to the nearest)."""
    return int(round(float(ms) * 1e6))


def step_end_ns(t_start_ns: int, step_ms: float) -> int:
    """Where a step ends by its measured time: its host start plus ``step_ms``.  A request's end, a
    step span's and a trace slice's end are this."""
    return int(t_start_ns) + ms_to_ns(step_ms)


def host_end_ns(t_start_ns: int, step_ms: float, t_end_ns: int = 0) -> int:
    """Where the scheduler got the step back (``t_end_ns``, host clock when ``run_batch`` returned);
    for a record without it, the measured end (``step_end_ns``).  Host gaps are measured from this."""
    return int(t_end_ns or 0) or step_end_ns(t_start_ns, step_ms)


def prompt_rows(ctx_lens: Sequence[int], accepted: Sequence[int]) -> Sequence[int]:
    """A prefill step's rows that prefill a prompt (or a retracted request's prompt + output): a
    mixed batch's decode rows (``accepted`` 1: a running request's token riding the batch) left
    out, unless the batch has no other row.  The prefill buckets place and count a step by these."""
    if not any(accepted):
        return ctx_lens
    return [c for c, a in zip(ctx_lens, accepted) if not a] or ctx_lens


def accepted_drafts(accepted: int, non_draft_tokens: int) -> int:
    """Draft positions one request had accepted in a step: its accepted length less the tokens that
    are not drafts (the bonus token; UNO's clean root as well)."""
    return max(0, accepted - non_draft_tokens)


def accepted_drafts_sum(accepted: Sequence[int], non_draft_tokens: int, total: Optional[int] = None) -> int:
    """``accepted_drafts`` summed over steps of the same ``non_draft_tokens`` (``accepted``: an
    ``array``, list or tuple; ``total``: its sum where the caller has it), in C-level passes with no
    Python call per step: each step's accepted less the non-draft tokens, plus back what a step that
    accepted fewer would take away."""
    n = non_draft_tokens
    total = sum(accepted) if total is None else total
    return total - n * len(accepted) + sum((n - k) * accepted.count(k) for k in range(n))


# LEAF_PHASES with each target forward (FORWARD_SPLIT) just before its parts: the order leaves are listed in.
_WHOLE_BEFORE = {parts[0]: whole for whole, parts in FORWARD_SPLIT.items()}
LEAF_ORDER = tuple(q for p in LEAF_PHASES for q in ((_WHOLE_BEFORE[p], p) if p in _WHOLE_BEFORE else (p,)))
assert len(LEAF_ORDER) == len(LEAF_PHASES) + len(FORWARD_SPLIT)  # every forward's parts are leaves


def leaf_phases(names: Iterable[str]) -> tuple[str, ...]:
    """The phases among ``names`` (a step's ``phases_ms`` keys) whose times add up to the step, in
    ``LEAF_PHASES`` order: each leaf phase present, and a target forward (``names.FORWARD_SPLIT``: a
    speculative step's verify, a plain step's decode) whole where none of its attention / MoE / rest
    parts is present (it ran in a CUDA graph whose split was not read), else by its parts."""
    have = set(names)
    return tuple(p for p in LEAF_ORDER
                 if p in have and not (p in FORWARD_SPLIT and any(c in have for c in FORWARD_SPLIT[p])))


def leaf_columns(items: Iterable[Iterable[str]]) -> tuple[list[frozenset[str]], tuple[str, ...]]:
    """Each item's leaf phases (``leaf_phases`` of its phase names), and the leaves any item has, in
    ``LEAF_ORDER``: the phase columns of a table (or the stack of a chart) of such items."""
    leaves = [frozenset(leaf_phases(names)) for names in items]
    return leaves, tuple(p for p in LEAF_ORDER if any(p in lv for lv in leaves))


def leaf_ms(phases: Mapping[str, float]) -> dict[str, float]:
    """A step's leaf phases (``leaf_phases``) and their times: what adds up to the step."""
    return {p: float(phases[p]) for p in leaf_phases(phases)}


@dataclass(frozen=True, slots=True)
class RankId:
    tp: int = 0
    dp: int = 0
    pp: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "RankId":
        d = d or {}
        return cls(int(d.get("tp", 0) or 0), int(d.get("dp", 0) or 0), int(d.get("pp", 0) or 0))

    @property
    def label(self) -> str:
        return f"tp{self.tp}-dp{self.dp}-pp{self.pp}"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step.  Times are milliseconds; ``phases_ms`` holds leaf phases plus ``verify``."""

    step_id: int
    kind: str
    algorithm: str
    rank: RankId
    rids: tuple[str, ...]
    ctx_lens: tuple[int, ...]
    accepted: tuple[int, ...]
    committed: tuple[int, ...]
    finished: tuple[bool, ...]
    draft_tokens: int
    step_ms: float
    phases_ms: Mapping[str, float] = field(default_factory=dict)
    t_start_ns: int = 0
    timing: str = "cpu"
    # W3C traceparent per request (aligned with rids) or () when none is known.  Filled on prefill
    # records only, from SGLang's own trace context (``--enable-trace``); see adapter.req_trace_parent.
    trace_parents: tuple[str, ...] = ()
    # Block drafters (names.BLOCK_ALGORITHMS): positions in the step's draft block including its
    # anchor (the last committed token), and the draft model forward passes that proposed it
    # (denoising / selection steps); 0 = not a block drafter or unknown.
    block_size: int = 0
    denoise_steps: int = 0
    # Tokens of ``accepted`` that are not accepted drafts: the bonus token (1), and UNO's clean
    # root as well (2); SGLang's ``num_non_draft_tokens_per_req``.
    non_draft_tokens: int = 1

    @property
    def accepted_drafts(self) -> tuple[int, ...]:
        """Per request: draft positions accepted this step, i.e. the accepted prefix of the draft
        (chain or block) after its anchor; position i (1-based) was accepted iff i <= this."""
        nd = self.non_draft_tokens
        return tuple(accepted_drafts(a, nd) for a in self.accepted)

    @property
    def draft_positions(self) -> int:
        """Draft positions one request could have accepted this step: the chain or block behind its
        anchor (``draft_tokens - 1``; 0 for a record without a draft)."""
        return max(0, self.draft_tokens - 1)
    # Execution fingerprint of the step: "graph" | "eager" | "piecewise" | "" (unknown), the
    # attention backend, and why verify did not run as a CUDA graph where that is known.
    exec_mode: str = ""
    attn_backend: str = ""
    # Host clock (time.time_ns) when the scheduler's run_batch returned: the gap to the next step's
    # t_start_ns is the scheduler's own time between steps.  0 = unknown (an older record).
    t_end_ns: int = 0
    # The step's draft budget in positions (the most drafts one request can have accepted: the
    # chain length, or the tree depth); 0 = unknown.  Positions beyond it are unobserved.
    draft_depth: int = 0
    exec_reason: str = ""
    # Prefill records: prompt tokens already in the prefix cache per request (aligned with rids).
    cached_lens: tuple[int, ...] = ()
    # The engine's own books of the requests that finished at this step (aligned with rids; () when
    # none did): (``spec_verify_ct`` or -1 without speculative decoding, ``completion_tokens``,
    # ``spec_num_correct_drafts`` or -1 where SGLang keeps none); (-1, -1, -1) for a running request.
    books: tuple[tuple[int, int, int], ...] = ()
    # Prefill records: each request's prompt tokens (SGLang's ``prompt_tokens``; aligned with rids).
    # ``ctx_lens`` is the prompt plus the output so far: more for a retracted request's re-prefill.
    prompt_lens: tuple[int, ...] = ()
    # Prefill records: the retractions SGLang made of each request since its previous prefill row
    # (``req.retraction_count``: also one that hit a prefill still in flight, which appended nothing).
    retractions: tuple[int, ...] = ()

    @property
    def batch_size(self) -> int:
        return len(self.rids)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens of a prefill batch found in the prefix cache (``names.CACHED_TOKENS``)."""
        return sum(self.cached_lens)

    @property
    def end_ns(self) -> int:
        """The step's end by its measured time (``step_end_ns``)."""
        return step_end_ns(self.t_start_ns, self.step_ms)

    @property
    def host_end_ns(self) -> int:
        """Host clock when the scheduler got the step back, else ``end_ns`` (``host_end_ns``)."""
        return host_end_ns(self.t_start_ns, self.step_ms, self.t_end_ns)

    @property
    def gap_from_ns(self) -> int:
        """Where the host gap before the next step starts (``host_end_ns``); 0 when every request of
        this batch finished: the server may sit idle until the next request, which is no host gap."""
        return 0 if False not in self.finished else self.host_end_ns

    @property
    def ctx_sum(self) -> int:
        return sum(self.ctx_lens)

    @property
    def ctx_mean(self) -> float:
        return self.ctx_sum / len(self.ctx_lens) if self.ctx_lens else 0.0

    @property
    def bucket_lens(self) -> Sequence[int]:
        """The context lengths that place the step in its bucket: every row of a decode step, the
        prompt rows of a prefill (:func:`prompt_rows`)."""
        return self.ctx_lens if self.kind == KIND_DECODE else prompt_rows(self.ctx_lens, self.accepted)

    def phase(self, name: str) -> float:
        if name == Phase.STEP.value:
            return self.step_ms
        return float(self.phases_ms.get(name, 0.0))

    def reported_phases(self, shapes: PhaseShapes) -> Iterator[tuple[str, float]]:
        """The ``(name, ms)`` pairs this record reports, in ``REPORTED_PHASES`` order (an iterator,
        read once): the step (``step_ms``, always first) and each phase present in ``phases_ms`` as a
        float (what :meth:`phase` reads; an absent one is left out, not read as 0).  ``shapes`` is the
        caller's own cache, per shape of ``phases_ms`` (its keys in order; at most ``SHAPES_KEPT``
        shapes), of the reported names and a getter of their values, so a record costs one dict
        look-up and C-level reads (this runs per record on the drain thread, twice)."""
        ph = self.phases_ms
        keys = tuple(ph)
        shape = shapes.get(keys)
        if shape is None:
            shape = _phase_shape(ph)
            if len(shapes) < SHAPES_KEPT:
                shapes[keys] = shape
        return zip(shape[0], (self.step_ms, *map(float, shape[1](ph))))

    def leaf_sum_ms(self) -> float:
        """The sum of the step's leaf phases (``leaf_ms``): the step's time when its phases add up."""
        return sum(leaf_ms(self.phases_ms).values())

    def to_dict(self) -> dict[str, Any]:
        """Builtins, one key per field in declaration order (plus ``batch_size`` after ``rank``)."""
        out: dict[str, Any] = {}
        for name, dump, _load, _default in _SHAPE:
            out[name] = dump(getattr(self, name))
            if name == "rank":
                out["batch_size"] = self.batch_size
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepRecord":
        """Read ``to_dict`` back; a missing or null key takes the field's default (the per-request
        ``accepted``/``committed``/``finished`` default to zeros/False, one per rid)."""
        n = len(d.get("rids") or ())
        kw: dict[str, Any] = {}
        for name, _dump, load, default in _SHAPE:
            v = d.get(name)
            if v is None:
                if default is _REQUIRED:
                    raise KeyError(name)
                v = _PER_REQUEST_DEFAULT[name] * n if name in _PER_REQUEST_DEFAULT else default
            kw[name] = load(v)
        kw["non_draft_tokens"] = kw["non_draft_tokens"] or 1
        return cls(**kw)


class HostGap:
    """The host gap before each step (ms): from where the previous one's starts (``gap_from_ns``) to
    this step's start; not measured before the first step, after idle time or after a break."""

    __slots__ = ("_from_ns",)

    def __init__(self) -> None:
        self._from_ns = 0

    def take(self, rec: StepRecord) -> Optional[float]:
        """The gap before ``rec`` (None where not measured); the next one is measured from ``rec``."""
        start, gap_from, end = rec.t_start_ns, self._from_ns, rec.gap_from_ns
        if start:
            self._from_ns = max(gap_from, end) if end else 0  # end 0: all finished (idle is no gap)
        return (start - gap_from) / 1e6 if start and gap_from and start >= gap_from else None

    def brk(self) -> None:
        """Steps went unrecorded (profiling off, or lost): the next step's gap is not measured."""
        self._from_ns = 0


@dataclass(frozen=True, slots=True)
class RequestEnd:
    """A request the scheduler ended outside its steps: aborted while it waited in SGLang's queue
    (before its first step, after a retraction, or between prefill chunks).  No step record will
    say it finished, so this does (``aggregate.requests.RequestLog.end``).  ``retracted``: it was
    waiting to be prefilled again after SGLang retracted it; ``t_ns``: host clock (``time.time_ns``)
    when SGLang aborted it, 0 = unknown; ``retractions``: SGLang's count of its retractions (what the
    client's ``num_retractions`` says; a retraction aborted before its re-prefill has no other trace)."""

    rid: str
    retracted: bool = False
    t_ns: int = 0
    retractions: int = 0

    @property
    def kind(self) -> str:
        """How it had been waiting (``names.ABORT_KINDS``): every view names the abort by this."""
        return ABORT_RETRACTED if self.retracted else ABORT_QUEUED


_REQUIRED = object()
_PER_REQUEST_DEFAULT: dict[str, tuple] = {"accepted": (0,), "committed": (0,), "finished": (False,)}
# How each declared field type becomes builtins and comes back (a new field of a new type fails at
# import until it is named here).
_CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], Any]] = {
    "int": (_same, int, 0), "float": (_same, float, 0.0), "str": (_same, str, ""),
    "RankId": (RankId.to_dict, RankId.from_dict, {}),
    "tuple[str, ...]": (list, lambda v: tuple(str(x) for x in v), ()),
    "tuple[int, ...]": (list, lambda v: tuple(int(x) for x in v), ()),
    "tuple[bool, ...]": (list, lambda v: tuple(bool(x) for x in v), ()),
    "Mapping[str, float]": (dict, lambda v: {str(k): float(x) for k, x in v.items()}, {}),
    "tuple[tuple[int, int, int], ...]": (lambda v: [list(b) for b in v],
                                         lambda v: tuple((int(b[0]), int(b[1]), int(b[2])) for b in v), ()),
}
# Fields without a dataclass default that a saved record may still lack (``step_id`` may not).
_READ_DEFAULT: dict[str, Any] = {"kind": KIND_DECODE}


def _default(f: Field, empty: Any) -> Any:
    """What ``from_dict`` reads for a missing key: the dataclass default, else the type's empty value."""
    if f.name == "step_id":
        return _REQUIRED
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return _READ_DEFAULT.get(f.name, empty)


# (name, to builtins, from builtins, default) per field of StepRecord, in declaration order.
def _shape(f: Field) -> tuple[str, Callable[[Any], Any], Callable[[Any], Any], Any]:
    dump, load, empty = _CODECS[str(f.type)]
    return f.name, dump, load, _default(f, empty)


_SHAPE = tuple(_shape(f) for f in fields(StepRecord))


def validate(rec: StepRecord) -> None:
    """Raise ValueError if a record is inconsistent (tests check the records they build with it)."""
    n = len(rec.rids)
    if rec.kind not in (KIND_DECODE, KIND_PREFILL):
        raise ValueError(f"unknown kind {rec.kind!r}")
    for name in ("ctx_lens", "accepted", "committed", "finished"):
        if len(getattr(rec, name)) != n:
            raise ValueError(f"{name} has {len(getattr(rec, name))} entries for {n} requests")
    if rec.trace_parents and len(rec.trace_parents) != n:
        raise ValueError(f"trace_parents has {len(rec.trace_parents)} entries for {n} requests")
    if rec.books and len(rec.books) != n:
        raise ValueError(f"books has {len(rec.books)} entries for {n} requests")
    for name in ("cached_lens", "prompt_lens", "retractions"):
        if getattr(rec, name) and len(getattr(rec, name)) != n:
            raise ValueError(f"{name} has {len(getattr(rec, name))} entries for {n} requests")
    if rec.step_ms < 0 or any(v < 0 for v in rec.phases_ms.values()):
        raise ValueError("negative duration")
    if rec.block_size < 0 or rec.denoise_steps < 0 or rec.non_draft_tokens < 1:
        raise ValueError("block_size and denoise_steps must be >= 0, non_draft_tokens >= 1")
