"""``model.rids.short_rid``: short rids kept as they are, long ones capped with a stable digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from sglang_ctxprof.model import rids


def test_short_rids_are_kept_as_they_are():
    for r in ("a", "x" * rids.RID_KEEP, "evil\x1b[2J"):
        assert rids.short_rid(r) == r


def test_long_rids_are_capped_with_a_digest_of_the_whole():
    a = "p" * 1000 + "a"
    b = "p" * 1000 + "b"
    sa, sb = rids.short_rid(a), rids.short_rid(b)
    assert sa != sb and len(sa) == rids.RID_KEEP + 2 + 16
    assert sa == "p" * rids.RID_KEEP + ".." + hashlib.sha256(a.encode()).hexdigest()[:16]
    assert rids.short_rid(a) is sa  # remembered per (length, hash): digested once
    assert rids.short_rid("q" * 300 + "\ud800").startswith("q" * rids.RID_KEEP)  # lone surrogate


def test_the_digest_is_the_same_in_another_process():
    """The HTTP process shortens a looked-up rid: it must agree with the scheduler's."""
    r = "z" * 200
    code = f"from sglang_ctxprof.model.rids import short_rid; print(short_rid({r!r}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == rids.short_rid(r)


def test_non_string_rids():
    assert rids.short_rid(12) == "12"


def test_a_shown_id_is_looked_up_as_it_is_and_never_shares_an_entry_with_the_rid_it_names():
    """The routes show ``prefix..digest``: a lookup of that shown id asks for it as it is.  A client
    that sends the shown id as its own rid, while the long rid's request runs, is kept apart."""
    for r in ("p" * 1000 + "a", "z" * (rids.RID_KEEP + 1), "q" * 300 + "\ud800"):
        s = rids.short_rid(r)
        assert rids.lookup_rid(s) == s and rids.short_rid(s) != s
    assert rids.lookup_rid("r0") == "r0" and rids.lookup_rid("p" * 300) == rids.short_rid("p" * 300)
    # only that exact shape is asked for as it is: a 146-character rid of another shape is shortened
    for other in ("p" * rids.RID_KEEP + ".." + "G" * 16, "p" * rids.RID_KEEP + "._" + "0" * 16,
                  "p" * rids.RID_KEEP + ".." + "ABCDEF0123456789", "p" * (rids.RID_KEEP + 18)):
        assert rids.lookup_rid(other) == rids.short_rid(other) != other


def test_a_rid_is_valid_unless_a_character_would_act_on_a_log_or_a_terminal():
    from sglang_ctxprof.model.rids import valid_rid

    for ok in ("r0", "user@1", "a/b", "é ü", "a\u00a0b", "a\u3000b", "\ue000", "\U0001fae8", "x" * 256):
        assert valid_rid(ok), repr(ok)  # spaces of any kind, private use, code points newer than this Python
    for bad in ("", "x" * 257, "a\tb", "a\x1b[2J", "a\x85b", "a\x9b2J", "a\u202eb", "a\u2028b", "a\u200bb", "\ud800"):
        assert not valid_rid(bad), repr(bad)
