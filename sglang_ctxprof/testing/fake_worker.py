"""SGLang's speculative worker, its requests and its result reduced to what ctxprof's hooks read.

The benchmarks drive :class:`~.fake_scheduler.FakeScheduler` with these:

* :class:`FakeWorker` imitates ``EAGLEWorkerV2.forward_batch_generation``: the draft
  (``FakeWorker.draft``, hooked as ``draft``), then the target model's verify forward
  (``FakeTarget.forward_batch_generation(batch, is_verify=True)``, hooked as ``verify``, as
  ``TpModelWorker``'s is), and returns ``batch.result``.  The target runs ``forward()`` when one is
  given (e.g. torch ops that release the GIL, as a model's do), else nothing;
* :class:`AcceptLens` is the face of SGLang's ``accept_lens`` CPU tensor that the adapter reads:
  ``is_cpu`` and ``tolist()``;
* :class:`FakeReq` is ``schedule_batch.Req`` as the hooks read it: ``rid``, ``origin_input_ids``,
  ``output_ids``, ``spec_verify_ct``, ``spec_num_correct_drafts``, ``finished_len``,
  ``finished_reason``, ``time_stats`` and ``finished()``; ``life`` (not SGLang's) is how many
  verify steps a benchmark lets it run before it finishes.

``HOOKS`` names each hook target in this module (``adapter.Target`` paths).  Imports only the
standard library.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

PATH = __name__
HOOKS = ((f"{PATH}.FakeTarget.forward_batch_generation", "verify"), (f"{PATH}.FakeWorker.draft", "draft"))


class FakeTarget:
    """The target model's worker: ``forward_batch_generation`` runs ``forward()`` (if any)."""

    def __init__(self, forward: Optional[Callable[[], None]] = None) -> None:
        self.forward = forward

    def forward_batch_generation(self, batch: Any, is_verify: bool = False) -> None:
        if self.forward is not None:
            self.forward()


class FakeWorker:
    """The speculative worker: draft, then the target's verify forward; returns ``batch.result``."""

    def __init__(self, forward: Optional[Callable[[], None]] = None) -> None:
        self.target = FakeTarget(forward)

    def forward_batch_generation(self, batch: Any) -> Any:
        self.draft(batch)
        self.target.forward_batch_generation(batch, is_verify=True)
        return batch.result

    def draft(self, batch: Any) -> None:
        return None


class AcceptLens:
    """A CPU tensor's face: ``is_cpu`` and ``tolist()``."""

    is_cpu = True

    def __init__(self, values: Sequence[int]) -> None:
        self._v = values

    def tolist(self) -> list[int]:
        return list(self._v)


class FakeReq:
    __slots__ = ("rid", "origin_input_ids", "output_ids", "spec_verify_ct", "finished_len", "finished_reason",
                 "time_stats", "spec_num_correct_drafts", "life")

    def __init__(self, rid: str, prompt: list, life: int = 0) -> None:
        self.rid = rid
        self.origin_input_ids = prompt
        self.output_ids = [1]
        self.spec_verify_ct = 0
        self.finished_len: Optional[int] = None
        self.finished_reason: Optional[str] = None
        self.time_stats = None
        self.spec_num_correct_drafts = 0
        self.life = life

    def finished(self) -> bool:
        return self.finished_reason is not None
