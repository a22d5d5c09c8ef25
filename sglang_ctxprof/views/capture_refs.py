"""Where the deep captures are, for the views that point at them: the request span and the diagnosis.

A capture is the dict of ``collect.capture.CaptureInfo.to_dict`` (``id``, ``trigger``, ``state``,
``step_ids``, ``rid``, ``path``...), as ``/ctx_profile/status`` and ``/ctx_profile/requests/{rid}``
serve it.  Its stable location is the route ``GET /ctx_profile/capture/<id>`` (``?format=trace``: the
profiler's own trace file, ``?format=timeline``: merged with our steps); ``path`` is the file on the
server, known once the profiler has stopped.

* :func:`span_attrs`: the request span's attributes naming the captures that covered its steps
  (``names.ATTR_CAPTURE_*``, one list entry per capture, in capture order; ``steps``: the request's
  step ids they cover).  A capture that covered none of its steps is left out.
* :func:`recent` and :func:`flag`: the diagnosis flag listing the most recent captures (id, trigger,
  steps, state and where to fetch them), read from the ranks' status in a served profile.

Pure: imports only ``model``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ..model import names

if TYPE_CHECKING:
    from .profile import Profile

RECENT = 5  # captures the diagnosis flag lists (the newest)
FLAG_KIND = "captures"


def uri(cid: str, fmt: str = "") -> str:
    return f"{names.ROUTE_CAPTURE}/{cid}" + (f"?format={fmt}" if fmt else "")


def span_attrs(captures: Iterable[Mapping[str, Any]], step_ids: Iterable[int]) -> dict[str, list]:
    """Attributes for a request span whose decode steps are ``step_ids``."""
    mine = set(int(s) for s in step_ids)
    ids: list[str] = []
    triggers: list[str] = []
    uris: list[str] = []
    paths: list[str] = []
    covered: list[int] = []
    for c in captures:
        steps = [int(s) for s in c.get("step_ids") or () if int(s) in mine]
        if not steps:
            continue
        ids.append(str(c["id"]))
        triggers.append(str(c.get("trigger") or ""))
        uris.append(uri(str(c["id"])))
        paths.append(str(c.get("path") or ""))
        covered.extend(steps)
    if not ids:
        return {}
    return {names.ATTR_CAPTURE_ID: ids, names.ATTR_CAPTURE_TRIGGER: triggers, names.ATTR_CAPTURE_URI: uris,
            names.ATTR_CAPTURE_PATH: paths, names.ATTR_CAPTURE_STEPS: sorted(set(covered))}


def recent(profile: "Profile") -> tuple[Mapping[str, Any], ...]:
    """The newest captures over the served profile's ranks (``profile.ranks[i]["status"]["capture"]``),
    deleted ones left out; () for a saved profile without ranks."""
    out: list[Mapping[str, Any]] = []
    for r in getattr(profile, "ranks", ()) or ():
        caps = (((r or {}).get("status") or {}).get("capture") or {}).get("captures") or ()
        out.extend(c for c in caps if isinstance(c, Mapping) and c.get("state") != names.CAPTURE_DELETED)
    out.sort(key=lambda c: int(c.get("requested_ns") or 0))
    return tuple(out[-RECENT:])


def _steps(ids: Sequence[int]) -> str:
    if not ids:
        return "no steps"
    if list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"steps {ids[0]}-{ids[-1]}" if len(ids) > 1 else f"step {ids[0]}"
    return "steps " + ",".join(str(i) for i in ids)


def describe(c: Mapping[str, Any]) -> str:
    """One capture: ``<id> (<trigger>[ for <rid>], <steps>, <state>): GET <route>?format=timeline``."""
    who = f" for request {c['rid']}" if c.get("rid") else ""
    where = f"GET {uri(str(c['id']), 'timeline')}"
    if c.get("state") == names.CAPTURE_FAILED:
        where = f"failed: {c.get('error') or 'no trace'}"
    elif c.get("path"):
        where += f" (file {c['path']})"
    why = f"; {c['reason']}" if c.get("reason") else ""
    steps = _steps(list(c.get("step_ids") or ()))
    return f"{c['id']} ({c.get('trigger')}{who}, {steps}, {c.get('state')}): {where}{why}"


def flag(captures: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The diagnosis flag listing ``captures`` (none: no flag)."""
    if not captures:
        return []
    return [{"kind": FLAG_KIND, "message": f"{len(captures)} recent deep capture(s): "
             + "; ".join(describe(c) for c in captures)}]
