"""The request id as the profiler keeps and shows it: at most :data:`RID_KEEP` characters, plus a digest.

Clients choose their own rids, of any length and content.  Every rank keeps thousands of rids after
their requests end (request history, recent steps, exported-rid memory), and every read route ships
them, so a long rid is kept as its first :data:`RID_KEEP` characters, ``..`` and the first 16 hex
digits of the SHA-256 of the whole rid (UTF-8): short, stable across processes (the HTTP process
shortens a looked-up rid the same way), and distinct for rids that share a prefix.  A rid of at
most :data:`RID_KEEP` characters is kept as it is, and so is a rid already of the shortened shape
(:data:`RID_KEEP` characters, ``..``, 16 lowercase hex digits): shortening is idempotent, so the id
a route shows finds its request when it is looked up (the lookup shortens it again).  A client
may itself send a rid of that shape: it is then kept under the same id as the long rid that
shortens to it, as two clients that send one rid share it (rids are the clients' own).

Hashing a long rid costs time linear in its length; :func:`short_rid` remembers the answer per
``(length, hash())`` of the string (Python caches a string's hash on the object), so a running
request's rid is digested once, and the cache holds no reference to the long string itself.
"""

from __future__ import annotations

import hashlib

RID_KEEP = 128
DIGEST_HEX = 16  # hex digits of the digest after ``..``
_CACHE_MAX = 4096
_HEX = frozenset("0123456789abcdef")
_cache: dict[tuple[int, int], str] = {}


def short_rid(rid: object) -> str:
    """``rid`` as the profiler keeps it (see the module docstring)."""
    s = rid if type(rid) is str else str(rid)
    n = len(s)
    if n <= RID_KEEP or _is_short(s, n):
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


def _is_short(s: str, n: int) -> bool:
    """Whether ``s`` (of length ``n``) has the shape :func:`short_rid` gives a long rid."""
    return (n == RID_KEEP + 2 + DIGEST_HEX and s[RID_KEEP:RID_KEEP + 2] == ".."
            and _HEX.issuperset(s[RID_KEEP + 2:]))
