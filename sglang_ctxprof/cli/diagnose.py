"""``sglang-ctxprof diagnose --url URL | PATH [--baseline PATH] [--plain PLAIN] [--ctx N]``: regression or
inherent, and is speculation paying?  ``--plain`` (a plain-decode server's saved profile or sweep, or
its URL) adds the speculation ledger with measured costs.

The source is a live server (its ``/ctx_profile``), a saved profile (a JSON file of that body, e.g.
from ``--save`` or ``show --json``) or a saved sweep directory; the baseline is a saved profile or
sweep directory.  Prints the diagnosis of ``views.diagnosis`` (``--json`` for the dict).  Exit code
1 when the baseline comparison finds a regression (for CI), 2 when it could compare nothing (the
diagnosis says why), else 0.

A profile is checked where it comes in (:func:`evidence_of`): one whose fields another version
wrote or a hand edited, which the diagnosis cannot read as the source, a baseline or a plain arm,
is one ``error:`` line naming the file (or server), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..views.diagnosis import Evidence


def add_cli_args(ap) -> None:
    ap.add_argument("path", nargs="?", default=None,
                    help="saved profile JSON or sweep directory (offline); omit with --url")
    ap.add_argument("--url", default=None, help="SGLang server base URL (live /ctx_profile)")
    ap.add_argument("--baseline", default=None, metavar="PATH", help="saved profile JSON or sweep directory")
    ap.add_argument("--plain", default=None, metavar="PLAIN",
                    help="plain-decode baseline of the same model: a saved profile JSON or sweep directory of a "
                         "server without speculation, or its URL (the speculation ledger: measured costs)")
    ap.add_argument("--ctx", type=int, default=None, metavar="N", help="what-if: predicted tok/s at N tokens")
    ap.add_argument("--save", default=None, metavar="FILE", help="also write the fetched profile (a baseline later)")
    ap.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")


def evidence_of(body: dict, source: str, name: str) -> "Evidence":
    """Evidence of a ``/ctx_profile`` body, read once in every role it may play (source, baseline,
    plain arm, printed): a body the diagnosis cannot read is a :class:`CliError` naming ``name``."""
    from ..views.diagnosis import diagnose, evidence_from_profile
    from ..views.diagnosis_text import render_text
    from ..views.profile import Profile
    from .main import REPLY_SHAPE, CliError

    try:  # what a profile another version wrote, or a hand edited, raises when read: at the file boundary only
        ev = evidence_from_profile(Profile.from_dict(body), source=source)
        render_text(diagnose(ev, ev, plain=ev))
    except REPLY_SHAPE as exc:
        raise CliError(f"{name} cannot be read as a /ctx_profile profile ({type(exc).__name__}: "
                       f"{str(exc)[:120]}): another version's, or edited?") from None
    return ev


def load_evidence(path: str, role: str) -> "Evidence":
    """Evidence of a saved profile JSON or a sweep directory; a clear error for anything else."""
    from ..views.diagnosis import evidence_from_sweep
    from . import sweep_results as res
    from .main import CliError, read_json_object

    p = Path(path)
    if p.is_dir():
        meta, points, sust = res.load_run(p)
        return evidence_from_sweep(res.summarize(points, sust), meta, source=f"sweep {path}")
    if not p.is_file():
        raise CliError(f"{role} {path!r} is neither a saved profile (JSON file) nor a sweep directory")
    body = read_json_object(p, "buckets", "a /ctx_profile body", role)
    return evidence_of(body, f"profile {path}", f"{role} {path}")


def plain_arm(ev: "Evidence", name: str) -> "Evidence":
    """``ev`` as the plain arm, or a :class:`CliError` naming ``name`` when it holds speculative steps
    (the server's ``POST /ctx_profile/plain`` refuses such a profile too)."""
    from ..views.diagnosis_evidence import speculative_phases
    from .main import CliError

    spec = speculative_phases(ev)
    if spec:
        raise CliError(f"{name} holds speculative steps ({', '.join(spec)} phases): the plain arm must come "
                       f"from a server without speculation")
    return ev


def run(ns) -> int:
    from ..views.diagnosis import diagnose
    from ..views.diagnosis_text import render_text
    from .main import CliError, write_atomic

    if (ns.url is None) == (ns.path is None):
        raise CliError("give either --url URL or a saved PATH, not both and not neither")
    if ns.url is not None:
        from .client import ServerClient

        body = ServerClient(ns.url, ns.api_key, timeout=60).require_profile()
        if ns.save:
            write_atomic(ns.save, json.dumps(body, indent=1))
        ev = evidence_of(body, f"server {ns.url}", f"the profile of {ns.url}")
    else:
        ev = load_evidence(ns.path, "source")
    base = load_evidence(ns.baseline, "baseline") if ns.baseline else None
    plain = None
    if ns.plain and ns.plain.startswith(("http://", "https://")):
        from .client import ServerClient

        body = ServerClient(ns.plain, ns.api_key, timeout=60).require_profile()
        plain = plain_arm(evidence_of(body, f"plain server {ns.plain}", f"the profile of {ns.plain}"),
                          f"the profile of {ns.plain}")
    elif ns.plain:
        plain = plain_arm(load_evidence(ns.plain, "plain baseline"), f"plain baseline {ns.plain}")
    d = diagnose(ev, base, ctx=ns.ctx, plain=plain)
    if ns.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        print(render_text(d), end="")
    if d["baseline"].get("given") and not d["baseline"].get("comparable"):
        return 2
    return 1 if d["baseline"].get("regressions") else 0
