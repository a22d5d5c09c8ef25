"""collect/capture_books: what the byte cap decides after an export (it removes no file itself)."""

from __future__ import annotations

from sglang_ctxprof.collect.capture_books import CaptureInfo, KeptFiles
from sglang_ctxprof.model import names

MB = 1024 * 1024


def info(cid: str, mb: float, state: str = names.CAPTURE_DONE) -> CaptureInfo:
    return CaptureInfo(id=cid, trigger=names.TRIGGER_MANUAL, steps=1, state=state, path=f"/x/{cid}", bytes=int(mb * MB))


def test_a_new_capture_alone_over_the_cap_goes_first_and_the_older_stay():
    books, old = KeptFiles(1.0), [info("a", 0.3), info("b", 0.3)]
    new = info("new", 2.0, names.CAPTURE_EXPORTING)
    gone, failed = books.enforce(new, old + [new])
    assert gone == ["/x/new"] and failed == [new] and new.state == names.CAPTURE_EXPORTING  # the caller fails it
    assert [c.state for c in old] == [names.CAPTURE_DONE] * 2 and books.bytes_kept == 2 * int(0.3 * MB)
    assert books.deleted == 1


def test_the_oldest_go_until_the_rest_fit_and_a_file_not_on_disk_counts_nothing():
    books = KeptFiles(1.0)
    a, b, c = info("a", 0.5), info("b", 0.4), info("c", 0.4)
    new = info("new", 0.3, names.CAPTURE_EXPORTING)
    gone, failed = books.enforce(new, [a, b, c, new])
    assert gone == ["/x/a", "/x/b"] and failed == [] and (a.state, b.state) == (names.CAPTURE_DELETED,) * 2
    assert books.bytes_kept == c.bytes + new.bytes and books.deleted == 2
    assert KeptFiles.kept([a, b, c, new]) == [c, new]
    assert KeptFiles(1.0).enforce(info("n", 0.1), []) == ([], [])


def test_a_kept_file_the_history_let_go_of_stays_in_the_books_and_goes_first():
    from collections import deque

    books, history = KeptFiles(1.0), deque(maxlen=2)
    a, b = info("a", 0.4), info("b", 0.3, names.CAPTURE_EXPORTING)
    c, d = info("c", 0.3, names.CAPTURE_FAILED), info("d", 0.3, names.CAPTURE_FAILED)
    for x in (a, b, c, d):
        books.listed(history, x)
    assert list(history) == [c, d] and list(books.older) == [("/x/a", a.bytes)]  # b still exports
    assert books.enforce(b, []) == ([], []) and list(books.older) == [("/x/a", a.bytes), ("/x/b", b.bytes)]
    new = info("new", 0.5, names.CAPTURE_EXPORTING)
    books.listed(history, new)
    assert books.enforce(new, [new]) == (["/x/a"], []) and books.bytes_kept == b.bytes + new.bytes
    books.enforce(info("n2", 0.1), [new], removed=["/x/b"])  # removed by hand: counts nothing now
    assert not books.older and books.bytes_kept == new.bytes and books.deleted == 1


def test_a_capture_the_history_lets_go_of_during_an_export_is_counted_once():
    """With several ranks a capture may be asked for while another exports: the history can let go
    of a capture between the exporter's look at the disk and the cap's books; it is then in both."""
    from collections import deque

    books, history = KeptFiles(3.0), deque(maxlen=2)
    a, b = info("a", 1.0), info("b", 1.0)
    books.listed(history, a)
    books.listed(history, b)
    on_disk = [a, b]  # what the exporter saw on disk
    books.listed(history, info("c", 0.0, names.CAPTURE_PENDING))  # meanwhile: a leaves, its file counts in older
    new = info("new", 1.0, names.CAPTURE_EXPORTING)
    assert books.enforce(new, on_disk + [new]) == ([], []) and books.bytes_kept == 3 * MB
    assert a.state == names.CAPTURE_DONE and books.deleted == 0


def test_a_capture_another_export_failed_meanwhile_is_not_dropped_again():
    books = KeptFiles(1.0)
    new = info("new", 2.0, names.CAPTURE_FAILED)  # over the cap, but another export's books failed it already
    assert books.enforce(new, []) == ([], []) and books.deleted == 0 and not books.older
