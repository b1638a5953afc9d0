"""A small OTLP/HTTP trace receiver, run as its own process: ``python -m tests.otlp_receiver PORTFILE OUT``.

It listens on a free loopback port (written to PORTFILE once it serves), accepts
``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (the wire format of
opentelemetry-exporter-otlp-proto-http) and appends one JSON object per received span to OUT:
trace_id, span_id, parent_span_id (hex), name, kind, service, attributes, status, events, links,
start/end times (ns).
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_lock = threading.Lock()


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which is None:
        return None
    return getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def spans_of(req: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        service = resource.get("service.name", "")
        instance = resource.get("service.instance.id", "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": _KINDS.get(s.kind, str(s.kind)),
                        "service": service,
                        "instance": instance,
                        "attributes": _attrs(s.attributes),
                        "status": _STATUS.get(s.status.code, str(s.status.code)),
                        "status_message": s.status.message,
                        "events": [{"name": e.name, "attributes": _attrs(e.attributes)} for e in s.events],
                        "links": [{"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex()} for ln in s.links],
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                    }
                )
    return out


def main(port_file: str, out_file: str) -> None:
    out = Path(out_file)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding", "") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            req = ExportTraceServiceRequest()
            try:
                req.ParseFromString(body)
            except Exception:
                self.send_response(400)
                self.end_headers()
                return
            lines = "".join(json.dumps(s) + "\n" for s in spans_of(req))
            with _lock, out.open("a") as f:
                f.write(lines)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = Path(port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(port_file)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


def waterfall(spans: list[dict[str, Any]], width: int = 40) -> str:
    """A text waterfall of one trace: spans as a tree (children by start time) with time bars."""
    if not spans:
        return ""
    t0 = min(s["start"] for s in spans)
    t1 = max(s["end"] for s in spans)
    scale = width / max(1, t1 - t0)
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(s)
    rows: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x["start"]):
            a = int((s["start"] - t0) * scale)
            b = max(a + 1, int((s["end"] - t0) * scale))
            bar = " " * a + "█" * (b - a)
            label = ("  " * depth + s["name"])[:44]
            service = s["service"].removeprefix("loopwire-")[:12]
            ms = (s["end"] - s["start"]) / 1e6
            mark = " ERROR" if s["status"] == "error" else ""
            rows.append(f"{label:<44} {service:<12} {ms:8.2f} ms |{bar:<{width}}|{mark}")
            walk(s["span_id"], depth + 1)

    walk("", 0)
    return "\n".join(rows)
