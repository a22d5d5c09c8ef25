"""Small fake HTTP servers for the sweep and the CLI (no SGLang): a fake "SGLang" answering
/model_info, /tokenize and /generate (timings proportional to the tokens) and 404 on /ctx_profile,
like a server started without --enable-ctx-profile; a web server that is not SGLang; and a
threading server that keeps quiet about clients that gave up."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeSGLang(BaseHTTPRequestHandler):
    max_len = 8192
    die_after = None  # generate calls before the fake starts failing (server "killed")
    hang_after = None  # generate calls before the fake stops answering (server stuck)
    calls = 0

    def log_message(self, *a):
        pass

    def _json(self, code, obj):
        raw = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/model_info":
            return self._json(200, {"model_path": "fake/model", "is_generation": True})
        return self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/tokenize":
            toks = [10 + (ord(c) % 400) for c in body["prompt"]]
            return self._json(200, {"tokens": toks, "count": len(toks), "max_model_len": self.max_len})
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
            time.sleep(len(ids) * 2e-6 + n * 1e-3)
            meta = {"id": f"r{cls.calls}", "prompt_tokens": len(ids), "completion_tokens": n, "cached_tokens": 0,
                    "spec_accept_length": 3.0, "spec_verify_ct": max(1, n // 3)}
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for k in range(1, n + 1, 3):
                    self.wfile.write(b"data: " + json.dumps({"meta_info": {**meta, "completion_tokens": k}}).encode()
                                     + b"\n\n")
                self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\ndata: [DONE]\n\n")
                return
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
