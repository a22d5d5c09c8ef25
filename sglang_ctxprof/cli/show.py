"""``sglang-ctxprof show --url URL [--url URL ...]``: a server's ``/ctx_profile`` as a table (or JSON).

With several ``--url`` (DP replicas behind a router, a fleet) it reads each server's mergeable state
(``/ctx_profile?format=state``: exact counts and histogram bins), merges them with the same exact
merge that joins the ranks of one server (``aggregate.snapshot.merge``), prints the merged profile,
and says which server gave what: per server its steps, request-steps, accepted tokens, prefill
batches, requests and dropped records, and per context bucket the steps each server contributed.
All servers must use the same bucketing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..views.profile import Profile


def add_cli_args(ap) -> None:
    ap.add_argument("--url", action="append", default=None, metavar="URL",
                    help="SGLang server base URL (default http://127.0.0.1:30000); repeat it to merge several servers")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")


def fetch(url: str, api_key: str | None = None, timeout: float = 30.0) -> dict:
    from .client import ServerClient

    return ServerClient(url, api_key, timeout).require_profile()


def fetch_state(url: str, api_key: str | None = None, timeout: float = 30.0) -> dict:
    from ..model import names
    from .client import ClientError, ServerClient

    body = ServerClient(url, api_key, timeout)._require(f"{names.ROUTE}?format={names.FORMAT_STATE}")
    if not isinstance(body, dict) or "state" not in body:
        raise ClientError(f"{url} did not answer a ctx profile state (an older sglang-ctxprof?)")
    return body


def merge_servers(bodies: list[tuple[str, dict]]) -> tuple["Profile", list[dict[str, Any]], dict[str, dict[str, int]]]:
    """(merged Profile, per-server totals, steps per bucket label per server) of ``(url, state body)``."""
    from ..aggregate.snapshot import Snapshot, merge
    from ..views.profile import build_profile
    from .main import CliError

    snaps = [(url, Snapshot.from_dict(b["state"])) for url, b in bodies]
    first_url, first = snaps[0]
    for url, s in snaps[1:]:
        if dict(s.bucketing) != dict(first.bucketing):
            raise CliError(f"{url} buckets contexts as {dict(s.bucketing)}, {first_url} as {dict(first.bucketing)}: "
                           "start every server with the same SGLANG_CTXPROF_BUCKETS to merge them")
    merged = build_profile(merge([s for _, s in snaps])).served(
        enabled=all(b.get("enabled") for _, b in bodies),
        dropped=sum(int(b.get("dropped", 0)) for _, b in bodies),
        ranks=tuple({"server": url} for url, b in bodies for _ in range(_answered(b))))
    per_server, by_bucket = [], {}
    for (url, s), (_, body) in zip(snaps, bodies):
        p = build_profile(s)
        n, of = _answered(body), int(body.get("ranks", 1))
        per_server.append({"url": url, "ranks": of, "answered": n, "missing": body.get("missing") or [],
                           "decode_steps": p.totals.decode_steps,
                           "request_steps": sum(b.req_steps for b in p.buckets), "accepted": p.totals.accepted,
                           "committed": p.totals.committed, "prefill_batches": p.totals.prefill_batches,
                           "requests_tracked": p.totals.requests_tracked, "dropped": int(body.get("dropped", 0))})
        for b in p.buckets:
            by_bucket.setdefault(b.label, {})[url] = b.steps
    by_bucket = {b.label: by_bucket[b.label] for b in merged.buckets}  # in context order
    return merged, per_server, by_bucket


def _answered(body: dict) -> int:
    """The ranks whose state a server's state body holds (every rank, from a server that predates the count)."""
    return int(body.get("answered", body.get("ranks", 1)))


def _fleet_text(merged: "Profile", per_server: list[dict[str, Any]], by_bucket: dict[str, dict[str, int]]) -> str:
    from ..views.text import _table, render

    keys = ("ranks", "decode_steps", "request_steps", "accepted", "committed", "prefill_batches",
            "requests_tracked", "dropped")
    rows = [[s["url"], str(s["answered"]) if s["answered"] == s["ranks"] else f"{s['answered']}/{s['ranks']}"]
            + [str(s[k]) for k in keys[1:]] for s in per_server]
    rows.append(["= merged", str(len(merged.ranks)), str(merged.totals.decode_steps),
                 str(sum(b.req_steps for b in merged.buckets)), str(merged.totals.accepted),
                 str(merged.totals.committed), str(merged.totals.prefill_batches),
                 str(merged.totals.requests_tracked), str(merged.dropped)])
    out = [f"fleet of {len(per_server)} servers, merged exactly (counts and histograms add)", ""]
    partial = [f"warning: {s['url']}: {s['answered']} of {s['ranks']} ranks answered ({'; '.join(s['missing'])}): "
               "its numbers are partial" for s in per_server if s["answered"] < s["ranks"]]
    out += partial + ([""] if partial else [])
    out += _table(["server"] + [k.replace("_", " ") for k in keys], rows)
    urls = [s["url"] for s in per_server]
    out += ["", "decode steps per context bucket, by server"]
    out += _table(["ctx"] + [f"#{i + 1}" for i in range(len(urls))] + ["merged"],
                  [[lab] + [str(c.get(u, 0)) for u in urls] + [str(sum(c.values()))] for lab, c in by_bucket.items()])
    out += [f"  #{i + 1} = {u}" for i, u in enumerate(urls)]
    return "\n".join(out) + "\n\n" + render(merged)


def run(ns) -> int:
    urls = [ns.url] if isinstance(ns.url, str) else (ns.url or ["http://127.0.0.1:30000"])
    if len(urls) == 1:
        body = fetch(urls[0], ns.api_key)
        if ns.json:
            print(json.dumps(body, indent=2))
        else:
            from ..views.profile import Profile
            from ..views.text import render

            print(render(Profile.from_dict(body)), end="")
        return 0
    from .main import CliError

    if len(set(urls)) != len(urls):
        raise CliError("the same --url is given twice: its profile would count twice")
    merged, per_server, by_bucket = merge_servers([(u, fetch_state(u, ns.api_key)) for u in urls])
    if ns.json:
        print(json.dumps({"servers": per_server, "steps_by_bucket": by_bucket, "merged": merged.to_dict()}, indent=2))
    else:
        print(_fleet_text(merged, per_server, by_bucket), end="")
    return 0
