"""Both adapters: retries before the stream only, hard stream errors, timeouts, cancellation, key hygiene."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

from services.model_step.models.anthropic import AnthropicModel
from services.model_step.models.base import (
    Model,
    ModelChunk,
    ModelError,
    ModelRequest,
    ModelStreamError,
    ModelUnavailableError,
)
from services.model_step.models.config import ProviderConfig
from services.model_step.models.openai_compat import OpenAICompatModel
from shared.content import text_of, user_text
from shared.natsserver import free_port
from tests.fakeproviders import FakeProvider, Reply, anthropic_stream, collect, error_reply, load_frames, openai_stream

KEY = "sk-robust-TEST-KEY-do-not-leak-42"
APIS = ["openai", "anthropic"]


@pytest.fixture(params=APIS)
def fake(request: pytest.FixtureRequest) -> Iterator[FakeProvider]:
    with FakeProvider(request.param) as server:
        yield server


def make(api: str, base_url: str, **overrides: object) -> Model:
    values: dict[str, object] = {
        "base_url": base_url,
        "api_key": KEY,
        "backoff_seconds": 0.01,
        "backoff_cap_seconds": 0.05,
    }
    values.update(overrides)
    cfg = ProviderConfig(**values)  # type: ignore[arg-type]
    return OpenAICompatModel("m", cfg) if api == "openai" else AnthropicModel("m", cfg)


def text_stream(api: str, parts: list[str]) -> list[bytes]:
    return openai_stream(text=parts) if api == "openai" else anthropic_stream(text=parts)


REQ = ModelRequest(messages=[user_text("hi")], timeout_seconds=5)


def assert_no_key(err: BaseException) -> None:
    assert KEY not in str(err) and KEY not in repr(err)
    assert all(KEY not in str(a) for a in err.args)
    assert err.__cause__ is None  # no httpx exception (holding the request headers) chained on


@pytest.mark.anyio
async def test_429_with_retry_after_then_success(fake: FakeProvider) -> None:
    fake.enqueue(
        error_reply(429, "rate limited", api=fake.api, headers={"retry-after": "1"}),
        Reply(frames=text_stream(fake.api, ["after ", "the wait"])),
    )
    start = time.monotonic()
    _, acc = await collect(make(fake.api, fake.base_url), REQ)
    elapsed = time.monotonic() - start
    assert text_of(acc.message()) == "after the wait"
    assert len(fake.requests) == 2 and fake.requests[0].body == fake.requests[1].body
    assert 0.95 <= elapsed < 4, elapsed  # honoured retry-after, not the 10 ms backoff


@pytest.mark.anyio
@pytest.mark.parametrize("status", [500, 503, 529])
async def test_5xx_exhausted_is_unavailable_with_the_status(fake: FakeProvider, status: int) -> None:
    fake.enqueue(*[error_reply(status, "try later", api=fake.api) for _ in range(3)])
    with pytest.raises(ModelUnavailableError, match="gave up after 3 attempts") as info:
        await collect(make(fake.api, fake.base_url, max_attempts=3), REQ)
    assert info.value.status == status and len(fake.requests) == 3
    assert "try later" in str(info.value)


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_client_errors_are_not_retried_and_never_show_the_key(fake: FakeProvider, status: int) -> None:
    fake.enqueue(error_reply(status, f"Incorrect API key provided: {KEY}. See the docs.", api=fake.api))
    with pytest.raises(ModelUnavailableError, match="request refused") as info:
        await collect(make(fake.api, fake.base_url), REQ)
    assert info.value.status == status and len(fake.requests) == 1
    assert "Incorrect API key provided: ***" in str(info.value)
    assert_no_key(info.value)


@pytest.mark.anyio
async def test_retry_after_beyond_the_limit_gives_up_at_once(fake: FakeProvider) -> None:
    fake.enqueue(error_reply(429, "slow down", api=fake.api, headers={"retry-after": "3600"}))
    start = time.monotonic()
    with pytest.raises(ModelUnavailableError, match="retry after 3600s"):
        await collect(make(fake.api, fake.base_url), REQ)
    assert time.monotonic() - start < 2 and len(fake.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("api", APIS)
async def test_connection_refused_is_retried_then_unavailable(api: str) -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ModelUnavailableError, match=r"could not reach .* after 3 attempts") as info:
        await collect(make(api, f"http://127.0.0.1:{port}", max_attempts=3), REQ)
    assert info.value.status == 0
    assert_no_key(info.value)


@pytest.mark.anyio
async def test_nothing_is_retried_once_the_stream_started(fake: FakeProvider) -> None:
    fake.enqueue(Reply(frames=text_stream(fake.api, ["a"])[:2], cut=True), Reply(frames=text_stream(fake.api, ["b"])))
    with pytest.raises(ModelStreamError, match="stream broke"):
        await collect(make(fake.api, fake.base_url), REQ)
    assert len(fake.requests) == 1


@pytest.mark.anyio
async def test_read_timeout_mid_stream_is_a_stream_error(fake: FakeProvider) -> None:
    frames = text_stream(fake.api, ["slow"])
    fake.enqueue(Reply(frames=frames, delay=1.0))
    start = time.monotonic()
    with pytest.raises(ModelStreamError, match="ReadTimeout"):
        await collect(make(fake.api, fake.base_url), ModelRequest(messages=[user_text("hi")], timeout_seconds=0.3))
    assert time.monotonic() - start < 1.5 and len(fake.requests) == 1


@pytest.mark.anyio
async def test_cancellation_closes_the_http_stream_promptly(fake: FakeProvider) -> None:
    frames = text_stream(fake.api, ["first", "second"])
    fake.enqueue(Reply(frames=frames[:4], hang=True))
    got: list[ModelChunk] = []
    with anyio.move_on_after(0.5) as scope:
        async for chunk in make(fake.api, fake.base_url).stream(REQ):
            got.append(chunk)
    cancelled_at = time.monotonic()
    assert scope.cancelled_caught and [c.text for c in got if c.kind == "text"][:1] == ["first"]
    assert await anyio.to_thread.run_sync(fake.disconnected.wait, 2.0)
    assert fake.disconnects[0] - cancelled_at < 1.0


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [b'data: {"choices": [\n\n', b"data: \xff\xfe\n\n", b"data: \n\n"])
async def test_an_undecodable_event_is_a_hard_stream_error_never_skipped(fake: FakeProvider, bad: bytes) -> None:
    frames = text_stream(fake.api, ["before", "after"])
    cut = next(i for i, f in enumerate(frames) if b'"before"' in f) + 1
    fake.enqueue(Reply(frames=[*frames[:cut], bad, *frames[cut:]]))
    got: list[ModelChunk] = []
    with pytest.raises(ModelStreamError, match="undecodable"):
        async for chunk in make(fake.api, fake.base_url).stream(REQ):
            got.append(chunk)
    assert [c.text for c in got if c.kind == "text"] == ["before"]


@pytest.mark.anyio
async def test_a_key_echoed_in_a_stream_error_is_redacted(fake: FakeProvider) -> None:
    name = "openai/error_event.sse" if fake.api == "openai" else "anthropic/error_event.sse"
    frames = load_frames(name)
    frames[-1] = (
        frames[-1]
        .replace(b"Overloaded", b"bad key " + KEY.encode())
        .replace(b"Sorry about that!", b"bad key " + KEY.encode())
    )
    fake.enqueue(Reply(frames=frames))
    with pytest.raises(ModelStreamError, match=r"bad key \*\*\*") as info:
        await collect(make(fake.api, fake.base_url), REQ)
    assert_no_key(info.value)


def test_every_model_error_is_a_model_error() -> None:
    assert issubclass(ModelUnavailableError, ModelError) and issubclass(ModelStreamError, ModelError)


@pytest.mark.anyio
async def test_a_json_answer_instead_of_a_stream_is_a_clear_error(fake: FakeProvider) -> None:
    fake.enqueue(Reply(status=200, headers={"content-type": "application/json"}, body=b'{"choices": []}'))
    with pytest.raises(ModelUnavailableError, match="answered with JSON, not an event stream"):
        await collect(make(fake.api, fake.base_url), REQ)
    assert len(fake.requests) == 1
