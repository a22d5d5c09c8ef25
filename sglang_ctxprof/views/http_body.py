"""The ``GET /ctx_profile`` JSON body, written from JSON texts kept with each build.

A served body is the envelope (``enabled``, ``degraded``, ``dropped``, ``spans_dropped``, ``ranks``)
around the merged profile's body, and each answering rank's entry in ``ranks`` holds that rank's
body; with one rank, that body *is* the merged one, so a plain ``json_response(profile.to_dict())``
would rebuild the merged dict and serialize the same body twice on every read.  :class:`BodyTexts`
(kept in ``http_build``'s cache beside the build) serializes each body once per build, on first
use (with one rank, the merged body's text is that rank's, after its ``schema_version``);
:func:`served_json` writes the envelope fresh and splices the kept texts in.  The bytes are
those ``http_guard.json_response(profile.to_dict())`` sends: the same keys in the same order, each
part through the same ``http_guard.dumps`` (non-finite floats as null, element by element).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Sequence

from starlette.responses import Response

from .http_guard import dumps
from .profile import Profile

_BODY = '"profile":'


class BodyTexts:
    """The JSON texts of one build's bodies: each rank's (``bodies``, None for a rank that answered
    an error) and the merged profile's without its ``schema_version`` (its other fields, opened)."""

    def __init__(self, bodies: Sequence[Optional[Mapping[str, Any]]], merged: Profile) -> None:
        self._bodies, self._merged = bodies, merged
        self._ranks: dict[int, str] = {}
        self._rest: Optional[str] = None
        self._lock = threading.Lock()

    def rank(self, i: int) -> str:
        with self._lock:
            if i not in self._ranks:
                self._ranks[i] = dumps(self._bodies[i])
            return self._ranks[i]

    def rest(self) -> str:
        """``,"timing":...}``: the merged body's fields after ``schema_version``, and the closing brace."""
        ok = [i for i, b in enumerate(self._bodies) if b is not None]
        if len(ok) == 1:  # one rank: its body is the merged one (``views.http._built``), already written
            one, text = self._bodies[ok[0]], self.rank(ok[0])
            head = '{"schema_version":' + dumps(one["schema_version"])  # its first key (Profile.to_dict)
            if next(iter(one)) == "schema_version" and text.startswith(head):
                return text[len(head):]
        with self._lock:
            if self._rest is None:
                body = self._merged.to_dict(envelope=False)
                text = dumps({k: v for k, v in body.items() if k != "schema_version"})
                self._rest = "," + text[1:] if len(text) > 2 else "}"
            return self._rest


def served_json(profile: Profile, texts: BodyTexts) -> Response:
    """``json_response(profile.to_dict())`` for a served ``profile`` whose bodies ``texts`` holds."""
    head = dumps({"schema_version": profile.schema_version, "enabled": profile.enabled,
                  "degraded": profile.degraded, "dropped": profile.dropped,
                  "spans_dropped": profile.spans_dropped})
    ranks = [("{" + dumps({"status": r["status"]})[1:-1] + "," + _BODY + texts.rank(i) + "}")
             if set(r) == {"status", "profile"} else dumps(dict(r)) for i, r in enumerate(profile.ranks)]
    text = head[:-1] + ',"ranks":[' + ",".join(ranks) + "]" + texts.rest()
    return Response(content=text.encode(), media_type="application/json")
