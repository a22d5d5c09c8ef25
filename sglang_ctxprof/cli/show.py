"""``sglang-ctxprof show --url URL``: fetch ``/ctx_profile`` and print it as a table (or JSON)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def add_cli_args(ap) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:30000", help="SGLang server base URL")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")


def fetch(url: str, api_key: str | None = None, timeout: float = 30.0) -> dict:
    from .main import CliError

    req = urllib.request.Request(url.rstrip("/") + "/ctx_profile")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise CliError(f"{url} has no /ctx_profile: start SGLang with --enable-ctx-profile") from None
        raise CliError(f"{url}/ctx_profile answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None


def run(ns) -> int:
    body = fetch(ns.url, ns.api_key)
    if ns.json:
        print(json.dumps(body, indent=2))
    else:
        from ..views.text import render

        print(render(body), end="")
    return 0
