"""Built-in tools, invoked directly (kv_memory against a real nats-server)."""

from __future__ import annotations

import http.server
import os
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
from nats.aio.client import Client as NATS

from services.tools.builtins import BUILTINS
from services.tools.builtins.calculator import evaluate, format_number
from services.tools.builtins.kv_memory import _encode_key
from services.tools.sdk import ToolContext, invoke
from services.toolwire.protocol import CallIds, ResultBody
from services.toolwire.spec import KIND_USER_INPUT
from shared.content import TextBlock
from shared.natsserver import free_port
from shared.settings import Settings

pytestmark = pytest.mark.anyio


async def run(name: str, args: object, ctx: ToolContext | None = None) -> ResultBody:
    return await invoke(BUILTINS[name], msgspec.json.encode(args), ctx or ToolContext())


def text(r: ResultBody) -> str:
    return "".join(b.text for b in r.blocks if isinstance(b, TextBlock))


# --- calculator -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("1+2*3", "7"),
        ("(1+2)*3", "9"),
        ("-2**2", "-4"),
        ("2**3**2", "512"),
        ("2**-1", "0.5"),
        ("7/2", "3.5"),
        ("6/2", "3"),
        ("7//2", "3"),
        ("-7%3", "2"),
        (" .5 + 1.5 ", "2"),
        ("1.5e3", "1500"),
        ("--3", "3"),
        ("0.1+0.2", "0.30000000000000004"),
        ("2**100", str(2**100)),
    ],
)
async def test_calculator(expression: str, answer: str) -> None:
    r = await run("calculator", {"expression": expression})
    assert (text(r), r.is_error) == (answer, False)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("1/0", "division by zero"),
        ("1%0", "division by zero"),
        ("0**-1", "division by zero"),
        ("2**100000", "result too large"),
        ("9**9**9", "result too large"),
        ("1e308*10", "not a finite number"),
        ("(-8)**0.5", "not a real number"),
        ("", "empty expression"),
        ("1+", "unexpected end"),
        ("(1", "unexpected end"),
        ("1)", "unexpected ')'"),
        ("__import__('os')", "unexpected character '_'"),
        ("abs(1)", "unexpected character 'a'"),
        ("1 2", "unexpected '2'"),
        ("(" * 200 + "1" + ")" * 200, "nested too deeply"),
        ("-" * 500 + "1", "nested too deeply"),
        ("1+" * 600 + "1", "longer than 1000"),
    ],
)
async def test_calculator_errors(expression: str, why: str) -> None:
    r = await run("calculator", {"expression": expression})
    assert r.is_error and text(r).startswith("error: ") and why in text(r), text(r)


def test_calculator_never_uses_eval() -> None:
    assert format_number(evaluate("3*(2+1)")) == "9"
    source = Path(BUILTINS["calculator"].fn.__code__.co_filename).read_text()
    assert "eval(" not in source.replace("evaluate(", "") and "exec(" not in source


# --- clock ------------------------------------------------------------------------------------------


async def test_clock() -> None:
    r = await run("clock", {"timezone": "Asia/Tokyo"})
    assert not r.is_error
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+09:00 \(Asia/Tokyo\)", text(r)), text(r)
    r = await run("clock", {})
    assert re.fullmatch(r".*\+00:00 \(UTC\)", text(r))


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../../etc/passwd", "/etc/localtime", "a" * 500])
async def test_clock_unknown_zone(zone: str) -> None:
    r = await run("clock", {"timezone": zone})
    assert r.is_error and text(r).startswith("error: unknown time zone")


# --- read_file / list_dir ---------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "hello.txt").write_text("hello\n")
    (root / "sub" / "deep.txt").write_text("deep")
    (root / "big.bin").write_bytes(b"x" * (300 * 1024))
    (tmp_path / "secret.txt").write_text("top secret")
    os.symlink(tmp_path / "secret.txt", root / "escape")
    os.symlink(tmp_path, root / "escape_dir")
    os.symlink(root / "hello.txt", root / "inside")
    os.mkfifo(root / "fifo")
    return root


def fctx(root: Path) -> ToolContext:
    return ToolContext(settings=Settings(tool_root=str(root)))


async def test_read_file_inside_root(tree: Path) -> None:
    assert text(await run("read_file", {"path": "hello.txt"}, fctx(tree))) == "hello\n"
    assert text(await run("read_file", {"path": "sub/deep.txt"}, fctx(tree))) == "deep"
    assert text(await run("read_file", {"path": "sub/../hello.txt"}, fctx(tree))) == "hello\n"
    assert text(await run("read_file", {"path": str(tree / "hello.txt")}, fctx(tree))) == "hello\n"
    assert text(await run("read_file", {"path": "inside"}, fctx(tree))) == "hello\n", "a link inside the root is fine"
    big = text(await run("read_file", {"path": "big.bin"}, fctx(tree)))
    assert big.endswith(f"[file truncated: showing the first {256 * 1024} of {300 * 1024} bytes]")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../secret.txt", "escapes the tool root"),
        ("sub/../../secret.txt", "escapes the tool root"),
        ("escape", "escapes the tool root"),
        ("escape_dir/secret.txt", "escapes the tool root"),
        ("/etc/passwd", "escapes the tool root"),
        ("missing.txt", "no such file"),
        ("sub", "not a regular file"),
        ("fifo", "not a regular file"),
        ("a\x00b", "invalid path"),
    ],
)
async def test_read_file_refuses(tree: Path, path: str, why: str) -> None:
    r = await run("read_file", {"path": path}, fctx(tree))
    assert r.is_error and why in text(r), text(r)
    assert "top secret" not in text(r)


async def test_list_dir(tree: Path) -> None:
    out = text(await run("list_dir", {"path": "."}, fctx(tree)))
    assert out.splitlines()[0] == "./ (7 entries)"
    assert "sub/" in out and "hello.txt  6 B" in out and "escape -> (link)" in out
    assert text(await run("list_dir", {"path": "sub"}, fctx(tree))).startswith("sub/ (1 entries)")
    for bad in ("..", "escape_dir", "../root/../.."):
        r = await run("list_dir", {"path": bad}, fctx(tree))
        assert r.is_error and "escapes the tool root" in text(r)
    r = await run("list_dir", {"path": "hello.txt"}, fctx(tree))
    assert r.is_error and "not a directory" in text(r)


# --- http_get ---------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Handler.hits.append(self.path)
        if self.path == "/redirect-out":
            self.send_response(302)
            self.send_header("Location", "http://example.com/")
            self.end_headers()
            return
        code = 404 if self.path == "/missing" else 200
        body = b"pong" if code == 200 else b"no"
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    _Handler.hits = []
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def hctx(*allow: str) -> ToolContext:
    return ToolContext(settings=Settings(http_allow=allow))


async def test_http_get_allowed_host(http_server: int) -> None:
    r = await run("http_get", {"url": f"http://127.0.0.1:{http_server}/ping"}, hctx("127.0.0.1"))
    assert not r.is_error and text(r) == "HTTP 200 OK\ncontent-type: text/plain\n\npong"
    r = await run("http_get", {"url": f"http://127.0.0.1:{http_server}/missing"}, hctx("127.0.0.1"))
    assert r.is_error and text(r).startswith("HTTP 404")


async def test_http_get_refuses_other_hosts_before_connecting(http_server: int) -> None:
    # The server listens on 127.0.0.1 but only "localhost" is allowed: refused without a connection.
    r = await run("http_get", {"url": f"http://127.0.0.1:{http_server}/ping"}, hctx("localhost"))
    assert r.is_error and "host '127.0.0.1' is not allowed" in text(r)
    assert _Handler.hits == []
    r = await run("http_get", {"url": "http://example.com/"}, ToolContext())  # default: loopback only
    assert r.is_error and "not allowed" in text(r)
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/", "http:///nohost", "http://127.0.0.1:99999/"):
        r = await run("http_get", {"url": url}, hctx("127.0.0.1"))
        assert r.is_error, url


async def test_http_get_refuses_redirect_to_other_host(http_server: int) -> None:
    r = await run("http_get", {"url": f"http://127.0.0.1:{http_server}/redirect-out"}, hctx("127.0.0.1"))
    assert r.is_error and "host 'example.com' is not allowed" in text(r)


async def test_http_get_connection_refused() -> None:
    port = free_port()  # nothing listens there
    r = await run("http_get", {"url": f"http://127.0.0.1:{port}/"}, hctx("127.0.0.1"))
    assert r.is_error and text(r).startswith("error: request failed")


# --- sleep, ask_user, kv_memory ---------------------------------------------------------------------


async def test_sleep_and_bounds() -> None:
    assert text(await run("sleep", {"seconds": 0.01})) == "slept 0.01s"
    for bad in (-1, 1e9):
        assert (await run("sleep", {"seconds": bad})).is_error


async def test_ask_user_is_a_user_input_tool() -> None:
    t = BUILTINS["ask_user"]
    assert t.spec().kind == KIND_USER_INPUT
    assert set(t.input_schema["properties"]) == {"question", "choices"}
    r = await run("ask_user", {"question": "Which?", "choices": ["a", "b"]})
    assert r.is_error and "user-input gate" in text(r)


async def test_kv_memory_per_loop(nc: NATS, settings: Settings) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())

    def ctx(loop: str) -> ToolContext:
        return ToolContext(ids=CallIds(loop_id=loop), nc=nc, settings=settings)

    assert text(await run("kv_memory", {"action": "list"}, ctx(a))) == "no notes yet"
    r = await run("kv_memory", {"action": "remember", "key": "colour. *>/x", "value": "blue"}, ctx(a))
    assert text(r) == "remembered 'colour. *>/x'"
    await run("kv_memory", {"action": "remember", "key": "size", "value": "XL"}, ctx(a))
    assert text(await run("kv_memory", {"action": "recall", "key": "colour. *>/x"}, ctx(a))) == "blue"
    assert text(await run("kv_memory", {"action": "list"}, ctx(a))) == "colour. *>/x\nsize"
    assert (
        text(await run("kv_memory", {"action": "recall", "key": "size"}, ctx(b))) == "nothing remembered under 'size'"
    )
    assert text(await run("kv_memory", {"action": "list"}, ctx(b))) == "no notes yet"
    for args, why in [
        ({"action": "recall"}, "needs a non-empty key"),
        ({"action": "forget", "key": "x"}, "invalid tool arguments"),
        ({"action": "remember", "key": "k", "value": "v" * 70000}, "larger than"),
    ]:
        r = await run("kv_memory", args, ctx(a))
        assert r.is_error and why in text(r), text(r)
    r = await run("kv_memory", {"action": "list"}, ToolContext(nc=nc, settings=settings))
    assert r.is_error and "loop id" in text(r)


async def test_kv_memory_lists_a_note_at_once_after_remembering_it(nc: NATS, settings: Settings) -> None:
    """A list right after a remember shows the note, every time: the server has sent it by then,
    and the client may not have read it yet (nats-py's KV watch then says "nothing pending")."""
    loop = str(uuid.uuid4())
    ctx = ToolContext(ids=CallIds(loop_id=loop), nc=nc, settings=settings)
    for i in range(60):
        await run("kv_memory", {"action": "remember", "key": f"k{i:02d}", "value": "v"}, ctx)
        listed = text(await run("kv_memory", {"action": "list"}, ctx)).split("\n")
        assert listed == [f"k{j:02d}" for j in range(i + 1)], (i, listed)


async def test_kv_memory_does_not_list_a_key_an_operator_removed(nc: NATS, settings: Settings) -> None:
    loop = str(uuid.uuid4())
    ctx = ToolContext(ids=CallIds(loop_id=loop), nc=nc, settings=settings)
    for key in ("kept", "gone", "purged"):
        await run("kv_memory", {"action": "remember", "key": key, "value": "v"}, ctx)
    kv = await nc.jetstream().key_value(settings.names.memory_bucket)
    await kv.delete(f"{loop}.{_encode_key('gone')}")
    await kv.purge(f"{loop}.{_encode_key('purged')}")
    assert text(await run("kv_memory", {"action": "list"}, ctx)) == "kept"
    await kv.delete(f"{loop}.{_encode_key('kept')}")
    assert text(await run("kv_memory", {"action": "list"}, ctx)) == "no notes yet"
