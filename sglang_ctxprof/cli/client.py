"""The CLI's one HTTP client: every command that talks to a server (show, trace, sweep, demo) uses it.

``ServerClient`` talks to one SGLang server: ``/model_info`` (is it SGLang?), ``/tokenize``,
``/generate`` (plain and streamed), and the ``/ctx_profile`` routes (named in ``model.names``).
Every expected failure - unreachable URL, a server that is not SGLang, an HTTP error, a server that
dies or times out mid-request - raises :class:`ClientError` (a ``CliError``) with a one-line
message.  A server without the profiler raises :class:`NoProfile` from :meth:`call`; the
``require_*`` readers turn that into the one line a user needs ("start SGLang with
--enable-ctx-profile").  Standard library only.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

from ..model import names
from ..model.rids import valid_rid
from .main import CliError

MAX_SLOWEST = names.MAX_SLOWEST
# what of a server's setup decides its decode speed (keys of SGLang's /server_info)
SETUP_KEYS = ("version", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
              "speculative_eagle_topk", "speculative_num_draft_tokens", "attention_backend", "dtype",
              "kv_cache_dtype", "quantization", "tp_size", "dp_size", "enable_dp_attention", "disable_cuda_graph",
              "context_length")
RID_PLAIN_RE = re.compile(names.RID_PLAIN)
CAPTURE_ID_RE = re.compile(names.CAPTURE_ID_PATTERN)


class ClientError(CliError):
    """An expected failure talking to a server; ``status``: the HTTP status, when it answered one."""

    def __init__(self, msg: str, status: int | None = None) -> None:
        super().__init__(msg)
        self.status = status


class NoProfile(Exception):
    """The server has no ``/ctx_profile`` route (the plugin is not loaded): not an error for a sweep."""


def _reason(exc: BaseException) -> str:
    r = getattr(exc, "reason", None) or exc
    if isinstance(r, (socket.timeout, TimeoutError)):
        return "timed out"
    return str(r) or type(r).__name__


class ServerClient:
    """``api_key``: SGLang's ``--api-key``; ``admin_key``: its ``--admin-api-key``, sent on the
    admin-level writes only (the reset), which take the API key where none is given."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0,
                 admin_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.admin_key = admin_key
        self.timeout = timeout

    # ------------------------------------------------------------------------------ plumbing
    def _req(self, method: str, path: str, body: Any = None, key: str | None = None) -> urllib.request.Request:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        if key or self.api_key:
            req.add_header("Authorization", f"Bearer {key or self.api_key}")
        return req

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None,
             key: str | None = None) -> Any:
        """JSON in, JSON out (``key``: the bearer token, else ``api_key``).  HTTP 404 on a ctx_profile
        route raises :class:`NoProfile`."""
        try:
            with urllib.request.urlopen(self._req(method, path, body, key), timeout=timeout or self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip().replace("\n", " ")[:300]
            try:
                msg = json.loads(detail).get("error", "")
            except Exception:  # noqa: BLE001 - not our JSON error body
                msg = ""
            if exc.code == 404 and not msg and path.startswith(names.ROUTE):
                raise NoProfile(path.split("?")[0]) from None
            raise ClientError(f"{self.url}{path} answered HTTP {exc.code}: {msg or detail}", exc.code) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise ClientError(f"cannot reach {self.url} ({method} {path}): {_reason(exc)}") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's recursion
            raise ClientError(f"{self.url}{path} did not answer JSON: is this an SGLang server?") from None

    # ------------------------------------------------------------------------------ SGLang API
    def model_info(self) -> dict:
        try:
            info = self.call("GET", "/model_info", timeout=30)
        except ClientError as exc:
            if "HTTP 404" in str(exc):
                raise ClientError(f"{self.url} is not an SGLang server (no /model_info)") from None
            raise
        if not isinstance(info, dict) or "model_path" not in info:
            raise ClientError(f"{self.url} is not an SGLang server (unexpected /model_info answer)")
        return info

    def server_setup(self) -> dict:
        """What of the server's setup decides its decode speed (:data:`SETUP_KEYS` of SGLang's
        ``/server_info``, ``/get_server_info`` before 0.5.2x); {} from a server that answers neither
        (its next request says why)."""
        for path in ("/server_info", "/get_server_info"):
            try:
                info = self.call("GET", path, timeout=60)
            except ClientError as exc:
                if exc.status == 404:
                    continue
                return {}
            return {k: info[k] for k in SETUP_KEYS if k in info} if isinstance(info, dict) else {}
        return {}

    def tokenize(self, text: str) -> tuple[list[int], int]:
        """Token ids of ``text`` (no special tokens) and the server's max model length."""
        out = self.call("POST", "/tokenize", {"prompt": text, "add_special_tokens": False}, timeout=120)
        if not isinstance(out, dict) or "tokens" not in out:
            raise ClientError(f"{self.url}/tokenize gave an unexpected answer")
        return list(out["tokens"]), int(out.get("max_model_len") or 0)

    def generate(self, ids: list[int], max_new_tokens: int) -> tuple[dict, float]:
        """Greedy ``/generate`` with ``ignore_eos``; returns (meta_info, wall seconds)."""
        body = {"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
        t0 = time.perf_counter()
        out = self.call("POST", "/generate", body)
        dt = time.perf_counter() - t0
        if not isinstance(out, dict) or "meta_info" not in out:
            raise ClientError(f"{self.url}/generate gave an unexpected answer")
        return out["meta_info"], dt

    def generate_stream(self, ids: list[int], max_new_tokens: int) -> Iterator[tuple[float, dict]]:
        """Streamed greedy generation: yields (perf_counter time, meta_info) per chunk.  A stream
        that ends without ``[DONE]`` (a dropped connection, a server that died) raises."""
        body = {"input_ids": ids, "stream": True, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
        try:
            with urllib.request.urlopen(self._req("POST", "/generate", body), timeout=self.timeout) as r:
                for line in r:
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise ClientError(f"{self.url}/generate stream error: {chunk['error']}")
                    yield time.perf_counter(), chunk.get("meta_info") or {}
            raise ClientError(f"{self.url}/generate: the stream ended before [DONE] (cut off)")
        except urllib.error.HTTPError as exc:
            raise ClientError(f"{self.url}/generate answered HTTP {exc.code}: "
                             f"{exc.read().decode(errors='replace')[:300]}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            raise ClientError(f"cannot reach {self.url} (streamed /generate): {_reason(exc)}") from None

    def profile_reset(self) -> bool:
        """Reset ``/ctx_profile`` (admin level: ``admin_key``); False when the server has no profiler."""
        try:
            self.call("POST", names.ROUTE_RESET, {}, timeout=60, key=self.admin_key)
            return True
        except NoProfile:
            return False
        except ClientError as exc:
            if exc.status in (401, 403) and not self.admin_key:
                raise ClientError(f"{exc} (a server with --admin-api-key wants it: give --admin-key)",
                                  exc.status) from None
            raise

    def profile(self) -> dict | None:
        try:
            return self.call("GET", names.ROUTE, timeout=60)
        except NoProfile:
            return None

    def profile_request(self, rid: str) -> dict | None:
        """One request's record; None only when the server has no profiler or its history no longer
        holds ``rid`` (HTTP 404).  Any other failure (a 504, a timeout) raises :class:`ClientError`:
        a caller must not take a failed read for a request without figures."""
        try:
            return self.call("GET", request_path(rid), timeout=min(60.0, self.timeout))
        except NoProfile:
            return None
        except ClientError as exc:
            if exc.status == 404:
                return None
            raise

    # ------------------------------------------------------------------------------ show / trace
    def _require(self, path: str) -> Any:
        try:
            return self.call("GET", path)
        except NoProfile as exc:
            raise ClientError(f"{self.url} has no {exc}: start SGLang with --enable-ctx-profile") from None

    def require_profile(self) -> dict:
        """``GET /ctx_profile``; a server without the profiler is an error."""
        return self._require(names.ROUTE)

    def require_request(self, rid: str) -> dict:
        """One request's step-by-step story; a malformed rid is refused before any network call."""
        if not valid_rid(rid):
            raise ClientError(names.RID_MALFORMED)
        return self._require(request_path(rid))

    def require_slowest(self, n: int) -> list[dict]:
        if not 1 <= n <= MAX_SLOWEST:
            raise ClientError(f"--slowest must be between 1 and {MAX_SLOWEST}, got {n}")
        return list(self._require(f"{names.ROUTE_REQUESTS}?slowest={n}&steps=1").get("requests") or [])


def request_path(rid: str) -> str:
    """Where one request's record is read: a plain rid in the path (as the live page asks), any
    other by ``?rid=`` (a "." or ".." segment a URL parser drops, a "/" the router splits on)."""
    if RID_PLAIN_RE.match(rid) and rid != "." and ".." not in rid:
        return f"{names.ROUTE_REQUESTS}/{urllib.parse.quote(rid, safe='')}"
    return f"{names.ROUTE_REQUESTS}?rid={urllib.parse.quote(rid, safe='')}"
