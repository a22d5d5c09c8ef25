"""SGLang's FastAPI app with the ``/ctx_profile`` routes, importable by path.

With ``--tokenizer-worker-num > 1`` each HTTP worker imports the app by the path in
``SGLANG_HTTP_SERVER_APP_PATH`` (0.5.23; earlier releases need the multi-tokenizer-app-path patch) and
runs no plugins, so the plugin points that variable here: ``sglang_ctxprof.http_app:app``.
"""

from __future__ import annotations

from sglang.srt.entrypoints.http_server import app

from .plugin import install_http_routes

install_http_routes(app)

__all__ = ["app"]
