"""Small fake HTTP servers for the sweep and the CLI (no SGLang): a fake "SGLang" answering
/model_info, /tokenize and /generate (timings proportional to the tokens) and 404 on /ctx_profile,
like a server started without --enable-ctx-profile; a web server that is not SGLang; a threading
server that keeps quiet about clients that gave up; and their quiet JSON handler to build others on.

A real server's long request is slower than its short one by many decode steps (hundreds of ms on
the CPU), far beyond what a busy machine adds to one HTTP round trip.  The fake's modeled time is a
few ms, which a loaded machine can swamp on the real clock: with a :class:`FakeClock` attached (and
the client reading it, :func:`clock_module`), the fake spends its modeled time on that clock instead
of sleeping, so on the clock the client reads the long request is always the slower one, by exactly
the modeled difference, whatever the machine's load.  Without one it sleeps (a fake in another
process)."""

from __future__ import annotations

import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeClock:
    """A ``perf_counter`` that only the fake moves (by its modeled time) - and every read by 1 us, so
    that two reads never agree, as on a real clock."""

    TICK = 1e-6

    def __init__(self) -> None:
        self._t = 1000.0
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            self._t += self.TICK
            return self._t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._t += seconds


def clock_module(clock: FakeClock) -> types.ModuleType:
    """A stand-in for the ``time`` module whose ``perf_counter`` is ``clock``'s (all else is ``time``'s)."""
    mod = types.ModuleType("time")
    mod.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    mod.perf_counter = clock.perf_counter
    return mod


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers JSON (``_json``)."""

    def log_message(self, *a):
        pass

    def _json(self, code, obj):
        raw = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class FakeSGLang(JsonHandler):
    max_len = 8192
    die_after = None  # generate calls before the fake starts failing (server "killed")
    hang_after = None  # generate calls before the fake stops answering (server stuck)
    clock: FakeClock | None = None  # where the modeled time goes (None: real sleeps)
    stall_short_s = 0.0  # real seconds a request for under 10 new tokens waits first (a busy machine)
    calls = 0
    model_path = "fake/model"
    bad_meta_after = None  # generate calls before the fake answers meta_info of the wrong shape
    tokens_answer = None  # what /tokenize answers as "tokens" instead (a reply of the wrong shape)
    info = None  # what /server_info answers (None: 404, as a server too old for it)
    info_then = None  # ... updated with this once ``info_after`` generate calls were made (a restart)
    info_after = None

    def do_GET(self):
        if self.path == "/model_info":
            return self._json(200, {"model_path": self.model_path, "is_generation": True})
        if self.path == "/server_info" and self.info is not None:
            later = self.info_after is not None and type(self).calls >= self.info_after
            return self._json(200, {**self.info, **(self.info_then if later else {}), "other": [1]})
        return self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/tokenize":
            toks = [10 + (ord(c) % 400) for c in body["prompt"]]
            if self.tokens_answer is not None:
                toks = self.tokens_answer
            count = len(toks) if isinstance(toks, list) else 0
            return self._json(200, {"tokens": toks, "count": count, "max_model_len": self.max_len})
        if self.path == "/generate":
            cls = type(self)
            cls.calls += 1
            if cls.die_after is not None and cls.calls > cls.die_after:
                self.connection.close()  # like a process that died mid-request
                return
            if cls.hang_after is not None and cls.calls > cls.hang_after:
                time.sleep(3)
            n = body["sampling_params"]["max_new_tokens"]
            ids = body["input_ids"]
            if n < 10:
                time.sleep(cls.stall_short_s)
            spend = cls.clock.advance if cls.clock is not None else time.sleep
            prefill_s, per_token_s = len(ids) * 2e-6, 1e-3
            meta = {"id": f"r{cls.calls}", "prompt_tokens": len(ids), "completion_tokens": n, "cached_tokens": 0,
                    "spec_accept_length": 3.0, "spec_verify_ct": max(1, n // 3)}
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                spend(prefill_s)
                for k in range(1, n + 1, 3):
                    spend(min(3, n - k + 1) * per_token_s)
                    self.wfile.write(b"data: " + json.dumps({"meta_info": {**meta, "completion_tokens": k}}).encode()
                                     + b"\n\n")
                self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\ndata: [DONE]\n\n")
                return
            spend(prefill_s + n * per_token_s)
            if cls.bad_meta_after is not None and cls.calls > cls.bad_meta_after:
                return self._json(200, {"text": "x", "meta_info": []})
            return self._json(200, {"text": "x", "meta_info": meta})
        return self._json(404, {"detail": "Not Found"})


class NotSGLang(FakeSGLang):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>hello</html>")

    do_POST = do_GET


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that gave up (timeout test): not news
        pass


class Servers:
    """The local servers one test starts, each serving on a thread of its own, shut at its end."""

    def __init__(self) -> None:
        self.made: list[QuietServer] = []

    def start(self, handler: type, **attrs) -> str:
        """A server of a subclass of ``handler`` with class attributes ``attrs``: its URL."""
        srv = QuietServer(("127.0.0.1", 0), type("H", (handler,), attrs))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.made.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    def close(self) -> None:
        for s in self.made:
            s.shutdown()
            s.server_close()
