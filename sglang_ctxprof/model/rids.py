"""The request id as the profiler keeps and shows it: at most :data:`RID_KEEP` characters, plus a digest.

Clients choose their own rids, of any length and content.  Every rank keeps thousands of rids after
their requests end (request history, recent steps, exported-rid memory), and every read route ships
them, so a long rid is kept as its first :data:`RID_KEEP` characters, ``..`` and the first 16 hex
digits of the SHA-256 of the whole rid (UTF-8): short, stable across processes (the HTTP process
shortens a looked-up rid the same way), and distinct for rids that share a prefix.  A rid of at
most :data:`RID_KEEP` characters is kept as it is.  A rid a client sends in the shortened shape
(:data:`RID_KEEP` characters, ``..``, 16 lowercase hex digits) is shortened like any other long rid,
so it never shares an entry with the long rid it names (SGLang runs both at once: their rids
differ).  A route looks a rid up with :func:`lookup_rid`: an id of the shortened shape, as the
routes show it, is asked for as it is; any other rid is shortened as the ranks keep it.

Hashing a long rid costs time linear in its length; :func:`short_rid` remembers the answer per
``(length, hash())`` of the string (Python caches a string's hash on the object), so a running
request's rid is digested once, and the cache holds no reference to the long string itself.
"""

from __future__ import annotations

import hashlib
import unicodedata

from .names import RID_MAX

RID_KEEP = 128
DIGEST_HEX = 16  # hex digits of the digest after ``..``
_CACHE_MAX = 4096
_HEX = frozenset("0123456789abcdef")
_cache: dict[tuple[int, int], str] = {}


_ACTING = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})  # control, format (bidi, zero-width), line/paragraph separator, surrogate


def valid_rid(rid: str) -> bool:
    """Whether the routes accept ``rid``: 1 to ``names.RID_MAX`` characters, none of which a log line or
    a terminal would act on (``_ACTING``).  Any other is taken, spaces of every kind, private use and
    code points newer than this Python's Unicode table included (so a client and a server on two
    Python versions agree)."""
    return 0 < len(rid) <= RID_MAX and not any(unicodedata.category(c) in _ACTING for c in rid)


def short_rid(rid: object) -> str:
    """``rid`` as the profiler keeps it (see the module docstring)."""
    s = rid if type(rid) is str else str(rid)
    n = len(s)
    if n <= RID_KEEP:
        return s
    key = (n, hash(s))
    hit = _cache.get(key)
    if hit is not None:
        return hit
    digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]
    out = f"{s[:RID_KEEP]}..{digest}"
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = out
    return out


def lookup_rid(rid: str) -> str:
    """The key a route asks the ranks for: an id the routes showed (the shortened shape) as it is,
    any other rid as the ranks keep it (:func:`short_rid`)."""
    return rid if _is_short(rid) else short_rid(rid)


def _is_short(s: str) -> bool:
    """Whether ``s`` has the shape :func:`short_rid` gives a long rid."""
    return (len(s) == RID_KEEP + 2 + DIGEST_HEX and s[RID_KEEP:RID_KEEP + 2] == ".."
            and _HEX.issuperset(s[RID_KEEP + 2:]))
