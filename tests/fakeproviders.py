"""A local HTTP server that speaks the OpenAI-compatible and Anthropic streaming wire formats.

Reusable by any test (unit, integration, or a model-step running as a separate process): it runs
in a daemon thread on a free loopback port, serves scripted replies and records every request.

    with FakeProvider("openai") as fake:
        fake.enqueue(Reply(frames=load_frames("openai/text_only.sse")))
        env = fake.env(api_key="sk-test")          # LW_OPENAI_BASE_URL / LW_OPENAI_API_KEY
        ...
        fake.requests[0].json()["messages"]

Replies are served in order (``enqueue``), or chosen by a ``responder(request) -> Reply``; see
:func:`by_position` (the k-th reply for a request whose history holds k assistant messages — what
a model-step that crashes and re-runs a step needs). Streams are sent with chunked transfer
encoding, one frame per write; ``cut`` drops the connection mid-body, ``hang`` holds it open until
the client goes away (recorded in ``disconnects``).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "providers"

# --- replies and recorded requests -------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    frames: list[bytes] = field(default_factory=list)  # SSE frames for a 200 stream
    body: bytes | None = None  # a plain (non-streamed) body, e.g. an error document
    delay: float = 0.0  # pause before each frame
    cut: bool = False  # after the frames, drop the connection without ending the body
    hang: bool = False  # after the frames, keep the connection open until the client leaves


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def error_reply(status: int, message: str, *, api: str = "openai", headers: dict[str, str] | None = None) -> Reply:
    if api == "anthropic":
        doc: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": message}}
    else:
        doc = {"error": {"message": message, "type": "server_error"}}
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        body=json.dumps(doc).encode(),
    )


def by_position(api: str, replies: list[Reply]) -> Callable[[RecordedRequest], Reply]:
    """A responder that answers the k-th reply for a request with k assistant messages."""

    def respond(request: RecordedRequest) -> Reply:
        k = sum(1 for m in request.json().get("messages", []) if m.get("role") == "assistant")
        if k < len(replies):
            return replies[k]
        return error_reply(500, f"fake provider: no reply #{k}", api=api)

    return respond


# --- the server ----------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        request = RecordedRequest("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        reply = fake._take(request)
        if reply.body is not None or (not reply.frames and reply.status != 200):
            payload = reply.body or b""
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            for frame in reply.frames:
                if reply.delay:
                    time.sleep(reply.delay)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.flush()
            if reply.hang:
                self._wait_for_disconnect()
                self.close_connection = True
                return
            if reply.cut:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            fake.disconnects.append(time.monotonic())
            fake.disconnected.set()
            self.close_connection = True

    def _wait_for_disconnect(self) -> None:
        fake = self.server.fake
        while not fake._stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.02)
            if readable:
                try:
                    gone = self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone:
                    fake.disconnects.append(time.monotonic())
                    fake.disconnected.set()
                    return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeProvider


class FakeProvider:
    """A scripted OpenAI-compatible (``api="openai"``) or Anthropic (``api="anthropic"``) server."""

    def __init__(
        self,
        api: str = "openai",
        replies: Iterable[Reply] = (),
        responder: Callable[[RecordedRequest], Reply] | None = None,
    ) -> None:
        if api not in ("openai", "anthropic"):
            raise ValueError("api must be 'openai' or 'anthropic'")
        self.api = api
        self.requests: list[RecordedRequest] = []
        self.disconnects: list[float] = []
        self.disconnected = threading.Event()
        self._replies = list(replies)
        self._responder = responder
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> FakeProvider:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # addressing
    @property
    def port(self) -> int:
        assert self._server is not None, "start() the fake provider first"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.api == "openai" else root

    def env(self, api_key: str = "sk-test-key", model: str = "test-model") -> dict[str, str]:
        """Environment for a model-step pointed at this server (LW_MODEL included)."""
        p = "LW_OPENAI" if self.api == "openai" else "LW_ANTHROPIC"
        return {f"{p}_BASE_URL": self.base_url, f"{p}_API_KEY": api_key, "LW_MODEL": f"{self.api}:{model}"}

    # scripting
    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def _take(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._responder is not None:
                return self._responder(request)
            if self._replies:
                return self._replies.pop(0)
        return error_reply(500, "fake provider: no scripted reply left", api=self.api)


# --- building streams in each API's wire format ---------------------------------------------------


def split_frames(text: str) -> list[bytes]:
    """A recorded SSE body split into its frames (each ends with its blank line)."""
    text = text.replace("\r\n", "\n")
    frames = [f.strip("\n") for f in text.split("\n\n")]
    return [(f + "\n\n").encode() for f in frames if f.strip()]


def load_frames(name: str) -> list[bytes]:
    """Frames of a recorded stream under tests/fixtures/providers (e.g. ``"openai/text_only.sse"``)."""
    return split_frames((FIXTURES / name).read_text(encoding="utf-8"))


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def fragments(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_stream(
    *,
    text: Iterable[str] = (),
    tool_calls: Iterable[tuple[str, str, Iterable[str]]] = (),
    finish: str | None = None,
    usage: tuple[int, int] | None = (10, 5),
    model: str = "test-model",
    done: bool = True,
) -> list[bytes]:
    """Chat-completion chunks: text deltas, then tool calls (id, name, argument fragments) by index."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": model}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "choices": [choice], "usage": None})

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": t}) for t in text]
    calls = list(tool_calls)
    for i, (call_id, name, frags) in enumerate(calls):
        first = {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        frames.append(chunk({"tool_calls": [first]}))
        frames += [chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in frags]
    frames.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
    if usage is not None:
        p, c = usage
        u = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        frames.append(sse({**base, "choices": [], "usage": u}))
    if done:
        frames.append(b"data: [DONE]\n\n")
    return frames


def anthropic_stream(
    *,
    text: Iterable[str] = (),
    tool_uses: Iterable[tuple[str, str, Iterable[str]]] = (),
    thinking: tuple[Iterable[str], str] | None = None,
    stop_reason: str | None = None,
    usage: tuple[int, int] | None = (10, 5),
    model: str = "test-model",
    stop: bool = True,
) -> list[bytes]:
    """Messages-API events: optional thinking block, a text block, then tool_use blocks."""
    p, c = usage or (0, 0)
    message: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": p, "output_tokens": 1},
    }
    frames = [sse({"type": "message_start", "message": message}, "message_start")]
    index = 0
    if thinking is not None:
        parts, signature = thinking
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}
        frames.append(sse(start, "content_block_start"))
        for t in parts:
            d = {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": t}}
            frames.append(sse(d, "content_block_delta"))
        d = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        }
        frames.append(sse(d, "content_block_delta"))
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    texts = list(text)
    if texts:
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        frames.append(sse(start, "content_block_start"))
        frames.append(sse({"type": "ping"}, "ping"))
        for t in texts:
            d = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}
            frames.append(sse(d, "content_block_delta"))
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    uses = list(tool_uses)
    for use_id, name, frags in uses:
        block = {"type": "tool_use", "id": use_id, "name": name, "input": {}}
        frames.append(
            sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")
        )
        for f in frags:
            d = {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": f},
            }
            frames.append(sse(d, "content_block_delta"))
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    reason = stop_reason or ("tool_use" if uses else "end_turn")
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": c},
    }
    frames.append(sse(delta, "message_delta"))
    if stop:
        frames.append(sse({"type": "message_stop"}, "message_stop"))
    return frames


# --- driving a model in tests -----------------------------------------------------------------------


async def collect(model: Any, request: Any, limit_seconds: float = 10.0) -> tuple[list[Any], Any]:
    """All chunks of ``model.stream(request)`` and their StreamAccumulator (bounded in time)."""
    import anyio

    from services.model_step.models.accumulator import StreamAccumulator

    chunks: list[Any] = []
    acc = StreamAccumulator()
    with anyio.fail_after(limit_seconds):
        async for chunk in model.stream(request):
            chunks.append(chunk)
            acc.add(chunk)
    return chunks, acc
