"""A canned stand-in for the SGLang server, for ``runner.py --dry`` (no GPU, no SGLang, no network).

It answers the routes the runner uses (``/generate``, ``/ctx_profile`` and its status, requests,
trace.json, diagnosis, reset/enable/disable) over real HTTP on 127.0.0.1, with numbers made up by a
simple rule (an EAGLE step accepts 3 tokens; attention grows with context), so the runner's stage logic,
its checks and its JSON run end to end.  ``BREAK`` (a set of names) makes the canned answers wrong on
purpose, so a test can see a check fail: ``leaves`` (leaves do not tile the step), ``reconcile``
(steps != spec_verify_ct), ``labels`` (no ``cuda_graph_events`` step).  ``CTXPROF_DRY_START_S`` makes
its start-up take that long (a test stops the runner mid-stage).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BREAK: set[str] = set()
ACCEPT = 3  # tokens committed per step (the last step commits the rest)


def _label(ctx: int) -> str:
    lo = 1 << max(0, int(math.log2(max(1, ctx))))
    return f"{lo}-{2 * lo}"



class _Server(ThreadingHTTPServer):
    """A listen backlog for the A/B stage's 16 concurrent clients: the default of 5 resets
    connections when a loaded machine is slow to accept them (as uvicorn would not)."""

    request_queue_size = 128

class _State:
    def __init__(self, graphs: bool) -> None:
        self.graphs = graphs
        self.lock = threading.Lock()
        self.enabled = True
        self.reset()

    def reset(self) -> None:
        self.reqs: dict[str, dict] = {}
        self.steps: list[dict] = []
        self.n = 0

    def generate(self, ids: list[int], new: int) -> dict:
        with self.lock:
            self.n += 1
            rid = f"dry{self.n}"
            steps = math.ceil((new - 1) / ACCEPT)
            if self.enabled:
                ctx = len(ids)
                for i in range(steps):
                    attn = 0.2 + 0.05 * ctx / 1000
                    ph = {"draft": 0.6, "verify_attn": attn, "verify_moe": 0.5 if self.graphs else 0.55,
                          "verify_rest": 0.3, "draft_extend": 0.25, "overhead": 0.05, "unattributed": 0.0}
                    sampled = self.graphs and len(self.steps) % 8 == 0
                    self.steps.append({"ctx": ctx, "rid": rid, "phases": ph, "committed": min(ACCEPT, new - 1 - i * ACCEPT),
                                       "timing": ("cuda_graph_events" if sampled and "labels" not in BREAK else
                                                  "cuda_graph") if self.graphs else "eager"})
                self.reqs[rid] = {"steps": steps + (1 if "reconcile" in BREAK else 0), "committed": new - 1}
            time.sleep(0.002)
            return {"text": "", "meta_info": {"id": rid, "prompt_tokens": len(ids), "completion_tokens": new,
                                              "spec_verify_ct": steps}}

    def profile(self) -> dict:
        with self.lock:
            by: dict[str, list[dict]] = {}
            for s in self.steps:
                by.setdefault(_label(s["ctx"]), []).append(s)
            leaves = ["draft", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead", "unattributed"]
            buckets = []
            for label, ss in sorted(by.items(), key=lambda kv: int(kv[0].split("-")[0])):
                ph = {}
                for p in leaves:
                    tot = sum(s["phases"][p] for s in ss)
                    ph[p] = {"mean_ms": tot / len(ss), "total_ms": tot}
                step = sum(ph[p]["total_ms"] for p in leaves) + (1.0 if "leaves" in BREAK else 0.0)
                ph["step"] = {"mean_ms": step / len(ss), "total_ms": step}
                v = sum(ph[p]["total_ms"] for p in ("verify_attn", "verify_moe", "verify_rest"))
                ph["verify"] = {"mean_ms": v / len(ss), "total_ms": v}
                buckets.append({"label": label, "steps": len(ss), "mean_batch_size": 1.0,
                                "accepted_per_step": ACCEPT - 1, "phases": ph})
            return {"enabled": self.enabled, "algorithms": ["EAGLE"], "leaf_phases": leaves, "buckets": buckets,
                    "timing": "cuda_graph_events" if self.graphs else "eager", "dropped": 0}


class DryServer:
    def __init__(self, args: list[str], graphs: bool = True) -> None:
        self.args = list(args)
        self.cmd = "dry-server " + " ".join(args)
        self.state = _State(graphs)
        self.httpd: ThreadingHTTPServer | None = None
        self.startup_s: float | None = None
        self.url = ""

    def start(self):
        from runner import Client  # noqa: PLC0415 - runner.py's folder is on sys.path

        t0 = time.time()
        slow = float(os.environ.get("CTXPROF_DRY_START_S", "0"))
        if slow:
            print("dry-server: starting slowly", flush=True)
            time.sleep(slow)
        state = self.state

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path == "/generate":
                    sp = body.get("sampling_params") or {}
                    return self._send(200, state.generate(body["input_ids"], int(sp.get("max_new_tokens", 16))))
                if self.path == "/ctx_profile/reset":
                    state.reset()
                    return self._send(200, {"ok": True})
                if self.path in ("/ctx_profile/enable", "/ctx_profile/disable"):
                    state.enabled = self.path.endswith("enable")
                    return self._send(200, {"enabled": state.enabled})
                return self._send(404, {"error": self.path})

            def do_GET(self):
                p = self.path.split("?")[0]
                if p == "/ctx_profile":
                    return self._send(200, state.profile())
                if p == "/ctx_profile/status":
                    split = {"mode": "cuda_graph_events" if state.graphs else "block_events",
                             "timed_copies": {"shapes": 6 if state.graphs else 0, "capture_s": 0.5, "bytes": 1 << 20}}
                    return self._send(200, {"ranks": [{"status": {
                        "enabled": state.enabled, "timing": "cuda_graph_events" if state.graphs else "eager",
                        "split": split, "hooks": {"installed": ["dry"]}, "coverage": {},
                        "cost": {"scheduler_us_per_step": 12.0}}}]})
                if p.startswith("/ctx_profile/requests/"):
                    r = state.reqs.get(p.rsplit("/", 1)[1])
                    return self._send(200, r) if r else self._send(404, {"error": "unknown rid"})
                if p == "/ctx_profile/trace.json":
                    last = int((self.path.split("last=") + ["64"])[1].split("&")[0])
                    if not 1 <= last <= 2048:  # as the real route
                        return self._send(400, {"error": f"last must be between 1 and 2048, got {last}"})
                    ev = [{"name": "decode step", "args": {"timing": s["timing"]}} for s in state.steps[-last:]]
                    return self._send(200, {"traceEvents": ev})
                if p == "/ctx_profile/diagnosis":
                    return self._send(200, {"headline": "verify attention grows with context (dry)",
                                            "physics": {"available": False, "reason": "dry"}, "phases": {},
                                            "flags": []})
                return self._send(404, {"error": p})

        self.httpd = _Server(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.startup_s = time.time() - t0
        return Client(self.url)

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
