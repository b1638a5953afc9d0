"""Opening a provider's streaming HTTP response (httpx), with retries only before it starts.

* Connection errors, timeouts before the response headers and 408/409/429/5xx/529 answers are
  retried with exponential backoff (jittered) honouring ``retry-after-ms`` / ``retry-after``;
  anything else (400, 401, 403, 404...) fails at once. Exhausted or refused →
  :class:`ModelUnavailableError`.
* Once a 200 response has started, nothing is retried: a broken connection, a read timeout
  (``timeout_seconds`` without a byte) or a malformed frame is a :class:`ModelStreamError`.
* Every message is bounded, stripped of control characters and has the API key removed; no
  httpx exception (whose request holds the auth header) is chained onto our errors.

One ``httpx.AsyncClient`` per call, closed with the stream: cancelling the consumer closes the
connection at once and no pool outlives a loop step.
"""

from __future__ import annotations

import email.utils
import functools
import random
import re
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, ClassVar, Final, Protocol

import anyio
import httpx
import msgspec

from services.model_step.models.base import ModelChunk, ModelRequest
from services.model_step.models.config import ProviderConfig
from services.model_step.models.errors import ModelStreamError, ModelUnavailableError
from services.model_step.models.sse import SSEDecodeError, SSEDecoder, SSEEvent

RETRY_STATUSES: Final = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_ERROR_BODY: Final = 64 * 1024
MAX_MESSAGE: Final = 300
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]+")


def clean(text: str, secret: str = "") -> str:
    """A message safe to raise or log: the secret removed, control characters folded, bounded."""
    if secret:
        text = text.replace(secret, "***")
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1] + "…"
    if secret and secret in text:  # the cut could not have created it, but be certain
        text = text.replace(secret, "***")
    return text


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's requested delay (``retry-after-ms``, then ``retry-after`` seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@functools.cache
def _tls() -> ssl.SSLContext:
    # Building a context loads the CA bundle, too slow for every client; one shared context is safe.
    return httpx.create_ssl_context()


def _backoff(config: ProviderConfig, attempt: int) -> float:
    base = min(config.backoff_cap_seconds, config.backoff_seconds * 2.0 ** (attempt - 1))
    return base * random.uniform(0.5, 1.0)


class _ErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorBody | str | None = None
    message: str | None = None


def error_message(body: bytes) -> str:
    """The human part of a provider's error body (OpenAI / Anthropic / vLLM shapes), else the text."""
    try:
        env = msgspec.json.decode(body, type=_ErrorEnvelope)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace")
    if isinstance(env.error, _ErrorBody):
        parts = [p for p in (env.error.type, env.error.message) if p]
        if parts:
            return ": ".join(parts)
    if isinstance(env.error, str):
        return env.error
    return env.message or body.decode("utf-8", "replace")


async def _read_bounded(response: httpx.Response) -> bytes:
    data = bytearray()
    try:
        async for part in response.aiter_bytes():
            data += part
            if len(data) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # the status is what matters; a partial body is still a hint
    return bytes(data[:MAX_ERROR_BODY])


@asynccontextmanager
async def open_stream(
    *,
    label: str,
    config: ProviderConfig,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    timeout_seconds: float,
) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the started 200 response (retrying before that point only)."""
    key = config.api_key
    timeout = httpx.Timeout(timeout_seconds)
    async with httpx.AsyncClient(timeout=timeout, verify=_tls()) as client:
        attempt = 0
        while True:
            attempt += 1
            request = client.build_request("POST", url, headers=dict(headers), content=body)
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as e:
                why = clean(f"{type(e).__name__}: {e}", key)
                if attempt >= config.max_attempts:
                    raise ModelUnavailableError(
                        f"{label}: could not reach {clean(url, key)} after {attempt} attempts ({why})"
                    ) from None
                await anyio.sleep(_backoff(config, attempt))
                continue
            if response.status_code == 200:
                if not response.headers.get("content-type", "").startswith("application/json"):
                    break
                # A server that ignored stream=true (or reports an error with 200): not retryable.
                try:
                    detail = error_message(await _read_bounded(response))
                finally:
                    await response.aclose()
                raise ModelUnavailableError(
                    f"{label}: the server answered with JSON, not an event stream ({clean(detail, key)})", status=200
                )
            try:
                detail = error_message(await _read_bounded(response))
            finally:
                await response.aclose()
            status = response.status_code
            why = clean(f"HTTP {status}: {detail}", key)
            if status not in RETRY_STATUSES:
                raise ModelUnavailableError(f"{label}: request refused ({why})", status=status)
            if attempt >= config.max_attempts:
                raise ModelUnavailableError(f"{label}: gave up after {attempt} attempts ({why})", status=status)
            delay = retry_after_seconds(response.headers)
            if delay is not None and delay > config.max_retry_after_seconds:
                raise ModelUnavailableError(
                    f"{label}: server asked to retry after {delay:.0f}s, more than the "
                    f"{config.max_retry_after_seconds:.0f}s allowed ({why})",
                    status=status,
                )
            await anyio.sleep(_backoff(config, attempt) if delay is None else delay)
        try:
            yield response
        finally:
            await response.aclose()


async def sse_events(response: httpx.Response, *, label: str, secret: str = "") -> AsyncGenerator[SSEEvent, None]:
    """The events of a started response. Transport failures and bad framing → ModelStreamError.

    Ends silently at a clean end of the body; the caller decides whether the response was
    complete (it saw its API's terminal event).
    """
    decoder = SSEDecoder()
    try:
        async for data in response.aiter_bytes():
            for event in decoder.feed(data):
                yield event
    except httpx.HTTPError as e:
        raise ModelStreamError(clean(f"{label}: stream broke: {type(e).__name__}: {e}", secret)) from None
    except SSEDecodeError as e:
        raise ModelStreamError(clean(f"{label}: undecodable stream: {e}", secret)) from None
    # An unterminated frame at the end is dropped (SSE rule); the caller then finds its
    # terminal event missing and fails the stream: a cut frame is never guessed at.


# --- the skeleton both HTTP adapters share ------------------------------------------------------


class StreamFolder(Protocol):
    """Turns one provider's decoded SSE events into ModelChunks."""

    done: bool  # the provider's end-of-stream marker arrived

    def on_data(self, data: str) -> list[ModelChunk]: ...

    def complete(self) -> bool: ...  # the response ended properly (not cut off)

    def closing(self) -> list[ModelChunk]: ...  # chunks due once the stream is over


class HttpStreamingModel:
    """An HTTP streaming provider: POST the request, fold the SSE events, close on cancel.

    Subclasses give the provider prefix, the URL, the request body, the headers and a folder.
    """

    provider: ClassVar[str]
    incomplete: ClassVar[str]  # what a stream that stopped early is called in the error

    def __init__(self, model: str, config: ProviderConfig) -> None:
        self.name = f"{self.provider}:{model}"
        self.model = model  # the provider's model name
        self._model = model
        self._config = config
        self._label = self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base_url={self._config.base_url!r})"

    @property
    def url(self) -> str:
        raise NotImplementedError

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _folder(self) -> StreamFolder:
        raise NotImplementedError

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        body = msgspec.json.encode(self.request_body(request))
        folder = self._folder()
        async with (
            open_stream(
                label=self._label,
                config=self._config,
                url=self.url,
                headers=self._headers(),
                body=body,
                timeout_seconds=request.timeout_seconds,
            ) as response,
            aclosing(sse_events(response, label=self._label, secret=self._config.api_key)) as events,
        ):
            async for event in events:
                for chunk in folder.on_data(event.data):
                    yield chunk
                if folder.done:
                    break
        if not folder.complete():
            raise ModelStreamError(f"{self._label}: stream ended before {self.incomplete}")
        chunks: Iterable[ModelChunk] = folder.closing()
        for chunk in chunks:
            yield chunk
