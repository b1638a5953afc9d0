"""Fuzz every built-in tool with random and mutated argument bytes: always a result, never a crash."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from services.toolcaller import client as cl
from services.tools.builtins import BUILTINS
from services.tools.builtins.calculator import evaluate
from services.tools.sdk import ToolContext, ToolError, invoke
from services.tools.service import ToolService
from services.toolwire.protocol import CallIds, ResultBody
from shared.content import TextBlock
from shared.settings import Settings
from tests import natsfixtures

VALID: dict[str, list[dict[str, Any]]] = {
    "calculator": [{"expression": "1+2*(3-4)/5"}, {"expression": "2**10 % 7"}],
    "clock": [{"timezone": "Europe/Paris"}, {}],
    "kv_memory": [
        {"action": "remember", "key": "k", "value": "v"},
        {"action": "recall", "key": "k"},
        {"action": "list"},
    ],
    "read_file": [{"path": "a.txt"}, {"path": "."}],
    "list_dir": [{"path": "."}, {"path": "d"}],
    "http_get": [{"url": "http://127.0.0.1:1/x"}, {"url": "http://localhost:1/"}],
    "sleep": [{"seconds": 0.001}],
    "ask_user": [{"question": "q", "choices": ["a"]}],
}
ATOMS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1e308,
    -1e-308,
    2**70,
    0.5,
    "",
    "../..",
    "/etc/passwd",
    "\x00",
    "\ud800",
    "é" * 50,
    "a" * 5000,
    "9" * 400,
    "((((",
    "**",
    "http://[::1",
    "file:///",
    [],
    {},
    [1, "x"],
    {"a": {"b": []}},
]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.random()
    if depth > 3 or pick < 0.5:
        return rng.choice(ATOMS)
    if pick < 0.75:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["expression", "timezone", "path", "url", "seconds", "action", "key", "x"]): random_json(
            rng, depth + 1
        )
        for _ in range(rng.randint(0, 3))
    }


def mutate(rng: random.Random, seed: dict[str, Any]) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
    if kind == 1:
        return json.dumps(random_json(rng)).encode()
    args = dict(seed)
    if kind == 2 and args:
        args[rng.choice(list(args))] = random_json(rng)
    elif kind == 3:
        args[rng.choice(["zzz", "path", "action", "choices"])] = random_json(rng)
    elif kind == 4 and args:
        del args[rng.choice(list(args))]
    data = bytearray(json.dumps(args, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"))
    if kind == 5 and data:
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    if kind == 6 and data:
        data = data[: rng.randrange(len(data))]
    return bytes(data)


def cases(n: int) -> list[tuple[str, bytes]]:
    rng = random.Random(20261129)
    return [(name, mutate(rng, rng.choice(seeds))) for name, seeds in VALID.items() for _ in range(n)]


def check(r: ResultBody) -> None:
    assert isinstance(r, ResultBody)
    if r.is_error:
        texts = [b.text for b in r.blocks if isinstance(b, TextBlock)]
        assert texts and texts[0].startswith(("error: ", "HTTP ")), texts


@pytest.fixture
def fuzz_settings(settings: Settings, tmp_path: Path) -> Settings:
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "d").mkdir()
    return dataclasses.replace(
        settings, tool_root=str(tmp_path), http_allow=("127.0.0.1",), heartbeat_seconds=0.2, tool_timeout_seconds=0.5
    )


@pytest.mark.anyio
async def test_fuzz_builtins_directly(nc: NATS, fuzz_settings: Settings) -> None:
    for name, raw in cases(120):
        ctx = ToolContext(ids=CallIds(loop_id="fuzz-loop"), nc=nc, settings=fuzz_settings, deadline=time.time() + 0.5)
        result = None
        with anyio.move_on_after(0.5):  # only a (valid) sleep may still be running here
            result = await invoke(BUILTINS[name], raw, ctx)
        if result is None:
            assert name == "sleep", (name, raw)
            continue
        check(result)


@pytest.mark.anyio
async def test_fuzz_builtins_over_nats(nc: NATS, fuzz_settings: Settings) -> None:
    """Through a real worker: every call ends ok (or timed out), the worker never stops answering."""
    await natsfixtures.create_deployment(fuzz_settings)
    async with anyio.create_task_group() as tg:
        await tg.start(ToolService(list(BUILTINS.values()), fuzz_settings).run)
        async with cl.ToolClient(nc, fuzz_settings.names, heartbeat_seconds=0.2) as client:
            statuses: list[str] = []

            async def one(i: int, name: str, raw: bytes) -> None:
                ids = CallIds(loop_id="fuzz-loop", step_id="s", tool_use_id=f"u{i}", execution_id=f"e{i}")
                out = await client.call(name, raw, ids=ids, timeout=0.5)
                assert out.status in (cl.OK, cl.TIMEOUT), (name, raw, out)
                if out.result is not None:
                    check(out.result)
                statuses.append(out.status)

            async with anyio.create_task_group() as calls:
                for i, (name, raw) in enumerate(cases(25)):
                    calls.start_soon(one, i, name, raw)
            assert len(statuses) == 25 * len(VALID)
            out = await client.call("calculator", b'{"expression": "6*7"}', ids=CallIds(), timeout=2)
            assert out.result is not None and msgspec.json.encode(out.result.blocks) == b'[{"type":"text","text":"42"}]'
        tg.cancel_scope.cancel()


@hsettings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789.eE+-*/%() \t")), max_size=60) | st.text(max_size=40))
def test_calculator_parser_never_raises_anything_but_tool_errors(expression: str) -> None:
    try:
        value = evaluate(expression)
    except ToolError:
        return
    assert isinstance(value, int | float)
