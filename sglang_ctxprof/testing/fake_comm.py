"""Ranks that reduce together inside CUDA graphs, for CPU tests of what each rank replays.

SGLang's custom all-reduce (``srt/distributed/device_communicators/custom_all_reduce.py``)
registers, at capture, the buffer each captured all-reduce reads, in capture order, and pairs the
ranks' registrations by that order.  At replay each rank's graph reads its peers' buffer with the
same registration index.  Every rank must therefore replay the *same* captured graph at the same
time: a rank that replays another graph (a timed copy where its peer replays the plain graph)
reads buffers of that other capture, which on a GPU gives stale hidden states and wrong tokens
without any error; a rank that runs the step eagerly while its peer replays a graph waits in a
collective its peer never enters (a hang).

:class:`FakeComm` models exactly that on simulated devices (``fake_cuda.FakeDevice``, one per rank,
run in lockstep by the test): :meth:`all_reduce` registers a buffer when called inside a capture
and launches a reduction otherwise; a replay launches the registration it captured
(``FakeDevice.on_launch``).  The k-th reduction each rank launches is paired with its peers'
k-th; when all ranks have launched it, the pairing must agree (the same registration, or all
eager), else :class:`CollectiveMismatch` is raised at once, so a test fails loudly where the
hardware would fail silently.
"""

from __future__ import annotations

from typing import Union

from .fake_cuda import FakeDevice

Launch = Union[int, str]  # a registration index (a graph's reduction) or "eager"
EAGER = "eager"


class CollectiveMismatch(AssertionError):
    """Ranks launched reductions that real hardware would pair wrongly (corruption or a hang)."""


class FakeComm:
    def __init__(self, ranks: int) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        self.ranks = ranks
        self.registered = [0] * ranks  # buffers registered by captures, per rank
        self.launched: list[list[Launch]] = [[] for _ in range(ranks)]
        self.paired = 0  # reductions every rank launched, checked equal

    def all_reduce(self, device: FakeDevice, rank: int, ms: float = 0.0) -> None:
        """An all-reduce on ``device``'s current stream: registered if capturing, launched if not."""
        if device.is_current_stream_capturing():
            idx = self.registered[rank]
            self.registered[rank] += 1
            device.on_launch(lambda: self._launch(rank, idx))
        else:
            self._launch(rank, EAGER)
        if ms:
            device.kernel(ms)

    def _launch(self, rank: int, what: Launch) -> None:
        mine = self.launched[rank]
        mine.append(what)
        k = len(mine) - 1
        if any(len(other) <= k for other in self.launched):
            return
        seen = [other[k] for other in self.launched]
        self.paired = k + 1
        if len(set(seen)) > 1:
            kinds = ", ".join(f"rank {r}: {'eager' if s == EAGER else f'graph buffer #{s}'}"
                              for r, s in enumerate(seen))
            raise CollectiveMismatch(f"reduction #{k} pairs different captures across ranks ({kinds}): "
                                     "on a GPU the ranks would read stale buffers or hang")

    def in_step(self) -> bool:
        """Every rank has launched the same number of reductions (none is waiting for a peer)."""
        return len({len(x) for x in self.launched}) == 1
