"""A deep capture's record, and the books of the byte cap on the kept trace files.

:class:`CaptureInfo` is one capture as ``/ctx_profile/status`` and the capture routes show it (its
underscored fields are the state machine's own, never shown).  :class:`KeptFiles` keeps the cap's
books (``deleted``, ``bytes_kept``) and decides, after an export, which files go: the new capture
first when it alone is over the cap (the older ones stay), then the oldest kept until the rest fit.
It only decides: the caller (``collect.capture``, under its lock) ends the captures it fails and
removes the files after releasing the lock.  It counts every kept file this rank wrote, also those
of captures the status no longer lists (``older``); files from another run count nothing.
Pure: no SGLang, no torch, no file system.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from ..model import names

KEPT = (names.CAPTURE_DONE, names.CAPTURE_EXPORTING)  # states whose file counts against the byte cap


@dataclass
class CaptureInfo:
    id: str
    trigger: str
    steps: int
    rid: Optional[str] = None
    reason: str = ""
    state: str = names.CAPTURE_PENDING
    requested_ns: int = 0
    trigger_step: Optional[int] = None  # the step that fired an automatic trigger
    wait_s: float = names.CAPTURE_WAIT_S  # how long it may stay pending (judged at control requests)
    cancelled: bool = False  # cancelled by an admin (``Capture.cancel``)
    step_ids: list[int] = field(default_factory=list)
    rids: list[str] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    sync_ns: tuple[int, int] = (0, 0)  # wall clock just before / after the clock_sync range
    path: Optional[str] = None
    bytes: int = 0
    stop_ms: float = 0.0  # scheduler-thread time to stop SGLang's profiler (all of _stop_profile)
    profiler_stop_ms: float = 0.0  # ... of which torch's own profiler stop()
    export_ms: float = 0.0  # export thread: writing the trace
    export_gap_ms: float = 0.0  # longest interval between step starts while exporting
    export_steps: int = 0  # steps that ran while exporting
    error: str = ""
    _waited: int = 0  # steps a rid capture has waited for its request
    _fed: int = -1  # steps run while it ran (``_ticks``) when the previous control request arrived (idle stop)
    _passed: int = 0  # other requests' prefills in a row a running rid capture passed over
    _unstarted: bool = False  # "running" on a rank where it failed to start: it follows the others' steps
    _ticks: int = 0  # steps run while it ran (counted or not): bounded (``capture.most_ticks``)
    _left: bool = False  # let go of by the history (``KeptFiles.listed``)
    _before_s: Optional[float] = None  # the cooling-off's start before it was asked for (given back if unstarted)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}  # not _waited, _fed, _passed
        return {**d, "sync_ns": list(self.sync_ns)}


class KeptFiles:
    """The byte cap (``max_mb``) on the kept trace files, and its books.  The status lists only the
    newest captures; a kept file of one it no longer lists stays in the books (``older``: its path
    and bytes, oldest first) until the cap removes it, so the cap bounds every file this rank wrote."""

    def __init__(self, max_mb: float) -> None:
        self.max_mb = max_mb
        self.deleted = 0  # captures whose file the cap removed
        self.bytes_kept = 0  # the kept files' bytes after the last export
        self.older: deque[tuple[str, int]] = deque()  # kept files of captures the history let go of

    def listed(self, history: deque[CaptureInfo], info: CaptureInfo) -> None:
        """Append ``info`` to ``history`` (a bounded deque); the capture it lets go of keeps its file
        in the books (one still exporting joins them when its export ends, ``enforce``)."""
        if len(history) == history.maxlen:
            old = history[0]
            if old.path and old.state == names.CAPTURE_DONE:
                self.older.append((old.path, old.bytes))
            old._left = True
        history.append(info)

    @staticmethod
    def kept(history: Iterable[CaptureInfo]) -> list[CaptureInfo]:
        """The captures whose file counts against the cap, oldest first."""
        return [c for c in history if c.path and c.state in KEPT]

    def enforce(self, new: CaptureInfo, on_disk: list[CaptureInfo],
                removed: Iterable[str] = ()) -> tuple[list[str], list[CaptureInfo]]:
        """After ``new`` was written (``on_disk``: kept captures found on disk, oldest first; ``removed``:
        files of ``older`` no longer on disk, removed by hand, which count nothing now): the files to
        remove, and the captures still exporting that go with them (the caller fails those); a done
        capture that goes is marked ``deleted`` here.  The caller ends ``new`` in the same hold of its
        lock, so the history never lets go of it between its books and its end."""
        cap, gone, failed = int(self.max_mb * 1024 * 1024), [], []
        if removed:
            lost = set(removed)
            self.older = deque(f for f in self.older if f[0] not in lost)

        def drop(c: CaptureInfo) -> None:
            self.deleted += 1
            if c.state == names.CAPTURE_EXPORTING:
                failed.append(c)
            else:
                c.state = names.CAPTURE_DELETED
            gone.append(c.path or "")  # kept captures have a path

        if new.state != names.CAPTURE_EXPORTING:
            pass  # another export's books failed it meanwhile (several ranks): it counts nothing now
        elif new.bytes > cap:
            drop(new)
        elif new._left:  # it left the history while exporting: its file is an older one now
            self.older.append((new.path or "", new.bytes))
        kept = [c for c in on_disk if c.state in KEPT and not c._left and all(c is not f for f in failed)]
        total = sum(b for _, b in self.older) + sum(c.bytes for c in kept)
        while self.older and total > cap:  # the files of captures no longer listed are the oldest
            path, size = self.older.popleft()
            self.deleted += 1
            gone.append(path)
            total -= size
        for c in kept:
            if total <= cap:
                break
            drop(c)
            total -= c.bytes
        self.bytes_kept = total
        return gone, failed
