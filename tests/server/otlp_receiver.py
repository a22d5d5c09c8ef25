"""A real OTLP/HTTP trace receiver for server tests: decodes each ``ExportTraceServiceRequest``
with the official ``opentelemetry-proto`` package and keeps the spans as dicts (name, scope,
service, ids, times, attributes); ``ours()`` lists this package's spans of one name."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang_ctxprof.cli.server import free_port
from sglang_ctxprof.model import names


class Receiver:
    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        rec = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest, ExportTraceServiceResponse)

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                rec.add(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def add(self, req) -> None:
        got = []
        for rs in req.resource_spans:
            svc = {kv.key: _val(kv.value) for kv in rs.resource.attributes}.get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append({"name": s.name, "scope": ss.scope.name, "service": svc,
                                "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(), "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "attrs": {kv.key: _val(kv.value) for kv in s.attributes}})
        with self.lock:
            self.spans.extend(got)

    def ours(self, name: str = names.SPAN_REQUEST) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["scope"] == names.TRACER_NAME and s["name"] == name]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _val(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
