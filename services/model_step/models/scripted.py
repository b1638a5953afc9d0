"""The scripted model: replays a JSON script of chunked responses (for tests and reproductions).

A script is either a list of responses, or an object::

    {"responses": [...],                  # played by position (below)
     "repeat_last": false,                # past the end: replay the last response (else an error)
     "report_input_tokens": false,        # end each response with a usage chunk: the request's
                                          # input tokens as counted for a window (docs/context.md)
     "summary": "...",                    # the response to a compaction request (a summary);
                                          # default: a text naming how many messages it covers
     "by_first_user_text": {"hi": [...]}} # per loop: responses chosen by the first user message's text

A response is a list of items, or a string (shorthand for one text chunk + finish ``end_turn``).
An item is a chunk (the fields of ``ModelChunk``: kind, text, index, id, name, usage,
finish_reason; ``{k}`` in an id becomes the response position) or a directive:

* ``{"error": "message"}`` — fail mid-stream here (ModelStreamError);
* ``{"unavailable": "message"}`` — fail before any chunk (ModelUnavailableError; first item only);
* ``{"sleep": seconds}`` — pause between chunks (without one, a response's chunks come at once);
* ``{"hang": true}`` — never continue (until cancelled).

Position: the k-th call (k = number of assistant messages in the request's history, from 0, with
those a compaction summary stands for) plays response k. It depends only on the committed
history, so a model-step replica that crashes and re-runs a step replays the same response.
Scripts are JSON; YAML is read only when PyYAML is installed (it is not a dependency).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec

from services.model_step.context import fixed_tokens
from services.model_step.models.base import CHUNK_KINDS, FINISH_END_TURN, ModelChunk, ModelRequest
from services.model_step.models.errors import ModelError, ModelStreamError, ModelUnavailableError
from shared.content import AIMessage, Usage, UserMessage, text_of
from shared.tokens import TextCounter, message_tokens, text_counter

DIRECTIVES: Final = ("error", "unavailable", "sleep", "hang")


class Directive(msgspec.Struct, frozen=True):
    name: str
    value: Any


Item = ModelChunk | Directive
Response = list[Item]


class ScriptError(ModelError):
    """A script file is missing or malformed."""


def _item(raw: object, where: str) -> Item:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: an item must be an object, got {type(raw).__name__}")
    directives = [k for k in raw if k in DIRECTIVES]
    if directives:
        if len(raw) != 1:
            raise ScriptError(f"{where}: a directive ({directives[0]}) must be alone in its object")
        name = directives[0]
        value = raw[name]
        if name in ("error", "unavailable") and not isinstance(value, str):
            raise ScriptError(f"{where}: {name} takes a message string")
        if name == "sleep" and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ScriptError(f"{where}: sleep takes a non-negative number of seconds")
        if name == "hang" and value is not True:
            raise ScriptError(f"{where}: hang takes true")
        return Directive(name, value)
    try:
        chunk = msgspec.convert(raw, ModelChunk)
    except msgspec.ValidationError as e:
        raise ScriptError(f"{where}: not a chunk: {e}") from None
    if chunk.kind not in CHUNK_KINDS:
        raise ScriptError(f"{where}: unknown chunk kind {chunk.kind!r} (one of {', '.join(CHUNK_KINDS)})")
    return chunk


def _response(raw: object, where: str) -> Response:
    if isinstance(raw, str):
        return [ModelChunk(kind="text", text=raw), ModelChunk(kind="finish", finish_reason=FINISH_END_TURN)]
    if not isinstance(raw, list):
        raise ScriptError(f"{where}: a response must be a list of items or a string")
    items = [_item(x, f"{where} item {j}") for j, x in enumerate(raw)]
    for j, it in enumerate(items):
        if isinstance(it, Directive) and it.name == "unavailable" and j != 0:
            raise ScriptError(f"{where} item {j}: unavailable must be the first item")
    return items


def _responses(raw: object, where: str) -> list[Response]:
    if not isinstance(raw, list):
        raise ScriptError(f"{where}: responses must be a list")
    return [_response(r, f"{where} response {i}") for i, r in enumerate(raw)]


class Script(msgspec.Struct, frozen=True):
    responses: list[Response]
    repeat_last: bool = False
    by_first_user_text: dict[str, list[Response]] = msgspec.field(default_factory=dict)
    report_input_tokens: bool = False
    summary: Response | None = None

    @classmethod
    def parse(cls, data: object, where: str = "script") -> Script:
        if isinstance(data, list):
            return cls(_responses(data, where))
        if not isinstance(data, dict):
            raise ScriptError(f"{where}: a script is a list of responses or an object with 'responses'")
        unknown = set(data) - {"responses", "repeat_last", "by_first_user_text", "report_input_tokens", "summary"}
        if unknown:
            raise ScriptError(f"{where}: unknown keys {sorted(unknown)}")
        repeat = data.get("repeat_last", False)
        if not isinstance(repeat, bool):
            raise ScriptError(f"{where}: repeat_last must be true or false")
        report = data.get("report_input_tokens", False)
        if not isinstance(report, bool):
            raise ScriptError(f"{where}: report_input_tokens must be true or false")
        keyed = data.get("by_first_user_text", {})
        if not isinstance(keyed, dict):
            raise ScriptError(f"{where}: by_first_user_text must be an object")
        return cls(
            responses=_responses(data.get("responses", []), where),
            repeat_last=repeat,
            by_first_user_text={k: _responses(v, f"{where} [{k[:40]!r}]") for k, v in keyed.items()},
            report_input_tokens=report,
            summary=_response(data["summary"], f"{where} summary") if "summary" in data else None,
        )


def load_script(path: str | Path) -> Script:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScriptError(f"scripted model: cannot read {str(p)[:200]!r}: {type(e).__name__}") from None
    data: object
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]  # optional, never a dependency
        except ImportError:
            raise ScriptError("scripted model: YAML scripts need PyYAML installed; use JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ScriptError(f"scripted model: {p.name} is not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ScriptError(f"scripted model: {p.name} is not valid JSON: {e}") from None
    return Script.parse(data, f"scripted model {p.name}")


def position(request: ModelRequest) -> int:
    """k: how many assistant messages the history holds (the k-th call plays response k)."""
    # Counting types in C: a 500-step loop's request holds 1,000 messages, counted at every step.
    return list(map(type, request.messages)).count(AIMessage) + request.summarised


class ScriptedModel:
    """``scripted:<path>``: replays a script (see the module docstring)."""

    def __init__(self, script: Script, name: str = "scripted") -> None:
        self.name = name
        self.model = ""  # not a provider's model
        self.script = script
        # Response k's items with "{k}" filled in, made once: a script serves every loop of a run.
        self._filled: dict[tuple[int, int], Response] = {}

    def __repr__(self) -> str:
        return f"ScriptedModel(name={self.name!r})"

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        return cls(load_script(path), name=f"scripted:{path}")

    @classmethod
    def from_data(cls, data: object, name: str = "scripted:<inline>") -> ScriptedModel:
        return cls(Script.parse(data), name=name)

    def response_for(self, request: ModelRequest, k: int | None = None) -> Response:
        """Response ``k`` (default: :func:`position` of the request) for the request's conversation."""
        responses = self.script.responses
        if self.script.by_first_user_text:
            first_user = next((m for m in request.messages if isinstance(m, UserMessage)), None)
            if first_user is not None:
                responses = self.script.by_first_user_text.get(text_of(first_user), responses)
        if k is None:
            k = position(request)
        if k < len(responses):
            return responses[k]
        if self.script.repeat_last and responses:
            return responses[-1]
        raise ModelUnavailableError(f"{self.name}: the script has no response #{k} ({len(responses)} scripted)")

    def _filled_in(self, response: Response, k: int) -> Response:
        key = (id(response), k)
        filled = self._filled.get(key)
        if filled is None:
            filled = self._filled[key] = [
                msgspec.structs.replace(item, id=item.id.replace("{k}", str(k)))
                if isinstance(item, ModelChunk) and "{k}" in item.id
                else item
                for item in response
            ]
        return filled

    def summary_for(self, request: ModelRequest) -> Response:
        """The response to a compaction request: the script's ``summary``, or a text saying what it covers."""
        if self.script.summary is not None:
            return self.script.summary
        return _response(f"Summary of {len(request.messages) - 1} messages.", "summary")

    async def _play(self, items: Iterable[Item]) -> AsyncIterator[ModelChunk]:
        # Chunks scripted back to back arrive at once, without yielding to the event loop: an
        # instant model, like the peers' in the benchmark (a pause, and a chance for cancellation
        # to land, is an explicit sleep or hang).
        for item in items:
            if isinstance(item, ModelChunk):
                yield item
            elif item.name == "sleep":
                await anyio.sleep(float(item.value))
            elif item.name == "hang":
                await anyio.sleep_forever()
            elif item.name == "error":
                raise ModelStreamError(f"{self.name}: {item.value}")
            else:
                raise ModelUnavailableError(f"{self.name}: {item.value}")

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if request.compaction:
            async for chunk in self._play(self.summary_for(request)):
                yield chunk
            return
        k = position(request)
        async for chunk in self._play(self._filled_in(self.response_for(request, k), k)):
            yield chunk
        if self.script.report_input_tokens:
            yield ModelChunk(kind="usage", usage=Usage(input_tokens=input_tokens(request, text_counter(self.name))))


def input_tokens(request: ModelRequest, count: TextCounter) -> int:
    """The request's input tokens as the model receives it (shared/tokens.py)."""
    fixed = fixed_tokens(request.system, request.tools, count)
    return fixed + sum(message_tokens(m, count) for m in request.messages)
