"""``sglang-ctxprof show --url URL``: fetch ``/ctx_profile`` and print it as a table (or JSON)."""

from __future__ import annotations

import json


def add_cli_args(ap) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")


def fetch(url: str, api_key: str | None = None, timeout: float = 30.0) -> dict:
    from .client import ServerClient

    return ServerClient(url, api_key, timeout).require_profile()


def run(ns) -> int:
    body = fetch(ns.url, ns.api_key)
    if ns.json:
        print(json.dumps(body, indent=2))
    else:
        from ..views.profile import Profile
        from ..views.text import render

        print(render(Profile.from_dict(body)), end="")
    return 0
