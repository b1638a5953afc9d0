"""The console's request bodies: a JSON object or a urlencoded form, decoded into msgspec Structs.

Every value arrives as a string (a form has nothing else; a JSON scalar is turned into its text),
so one Struct reads both. A refused field gets the console's own wording ("text is required",
"system is longer than 100000 characters", "command_id must be a lowercase UUID"...), never
msgspec's, and fields are checked in the Struct's order: the first bad one is the one named.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Annotated, Final, Literal, TypeVar, cast
from urllib.parse import parse_qsl

import msgspec
import msgspec.inspect
from msgspec import Meta
from starlette.requests import Request

from services.console.errors import ApiError, invalid
from services.console.params import INTEGER_BODY, integer
from services.model_step.policy import parse_policy as policy_rules
from shared.errors import ErrorKind
from shared.events import Limits
from shared.settings import split_list
from shared.wiretypes import (
    MAX_LIMIT_VALUE,
    NON_BLANK_PATTERN,
    POLICY_EFFECTS,
    UUID_OR_EMPTY_PATTERN,
    UUID_PATTERN,
    PolicyEffect,
    exact,
)

MAX_BODY_BYTES: Final = 256 * 1024
MAX_TEXT_CHARS: Final = 100_000
MAX_OPERATOR_CHARS: Final = 64
MAX_ITERATIONS: Final = MAX_LIMIT_VALUE

# A field without a default is required: absent or blank, it is refused as "<name> is required".
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
RequiredText = Annotated[str, Meta(max_length=MAX_TEXT_CHARS, pattern=NON_BLANK_PATTERN)]
Operator = Annotated[str, Meta(max_length=MAX_OPERATOR_CHARS)]
GateId = Annotated[str, Meta(max_length=MAX_TEXT_CHARS, pattern=UUID_PATTERN)]
UuidOrEmpty = Annotated[str, Meta(pattern=UUID_OR_EMPTY_PATTERN)]
IntegerOrEmpty = Annotated[str, Meta(pattern=exact(f"(?:{INTEGER_BODY})?"))]

# What a value of the wrong form is told, by field name (the same in every body).
_WRONG_FORM: Final[dict[str, Callable[[str], str]]] = {
    "command_id": lambda _: "command_id must be a lowercase UUID",
    "loop_id": lambda _: "loop_id must be a lowercase UUID",
    "gate_id": lambda v: f"gate id {v!r} is not a lowercase UUID",
    "default_policy": lambda _: f"default_policy must be one of {', '.join(POLICY_EFFECTS)}",
    "at": lambda _: "at must be an integer (ASCII digits)",
    "max_iterations": lambda _: "max_iterations must be an integer (ASCII digits)",
}
_FIELD_AT: Final = re.compile(r"`\$\.([A-Za-z_]+)`|required field `([A-Za-z_]+)`")


class CommandBody(msgspec.Struct, kw_only=True):
    """Any action's body: the command id the page minted for the click (a fresh one when absent)."""

    command_id: UuidOrEmpty = ""

    def __post_init__(self) -> None:
        if not self.command_id:
            self.command_id = str(uuid.uuid4())


class StartBody(CommandBody, kw_only=True):
    """``POST /api/loops``: a new loop, and optionally its first input."""

    loop_id: UuidOrEmpty = ""
    default_policy: Literal["", "allow", "deny", "ask"] = ""
    max_iterations: IntegerOrEmpty = ""
    model: str = ""
    system: Text = ""
    tools: str = ""  # comma-separated tool names
    policy: str = ""  # TOOL=effect items, separated by commas or lines
    input: Text = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.loop_id:
            self.loop_id = str(uuid.uuid4())
        # Checked here, so a body the API refuses never starts anything.
        self.limits()
        self.policy_rules()

    def limits(self) -> Limits | None:
        if not self.max_iterations:
            return None
        return Limits(max_iterations=integer(self.max_iterations, "max_iterations", low=1, high=MAX_ITERATIONS))

    def policy_rules(self) -> dict[str, PolicyEffect] | None:
        """The policy's rules (None when it has none); ``invalid`` names a bad item."""
        try:
            rules = policy_rules(line for line in self.policy.replace(",", "\n").splitlines() if line.strip())
        except ValueError as e:
            raise invalid("policy", f"policy wants {e}") from None
        return rules or None

    def tool_names(self) -> list[str] | None:
        return list(split_list(self.tools)) if self.tools else None


class ForkBody(CommandBody, kw_only=True):
    """``POST /api/loops/{id}/fork``: a new loop from ``at`` (the tip when absent), with an input."""

    at: IntegerOrEmpty = ""
    input: Text = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_seq()

    def at_seq(self) -> int | None:
        return integer(self.at, "at") if self.at else None


class InputBody(CommandBody, kw_only=True):
    """``POST /api/loops/{id}/input``."""

    text: RequiredText


class AnswerBody(CommandBody, kw_only=True):
    """``POST /api/loops/{id}/answer``: the answer to one gate (its action is checked by the loop API)."""

    gate_id: GateId
    action: RequiredText
    operator: Operator = ""
    text: Text = ""
    reason: Text = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.operator = self.operator.strip()


BodyT = TypeVar("BodyT", bound=CommandBody)


async def read_body(request: Request, kind: type[BodyT]) -> BodyT:
    """The request's body as ``kind``; a body or field the API refuses is a clear ``invalid``."""
    fields = await read_fields(request)
    names = [f.encode_name for f in msgspec.structs.fields(kind)]
    # Every field present, in the Struct's order: the first bad field is the one reported.
    ordered = {name: fields.get(name, "") for name in names}
    try:
        return msgspec.convert(ordered, kind)
    except msgspec.ValidationError as e:
        raise _refusal(kind, e, ordered) from None


def _refusal(kind: type[CommandBody], e: msgspec.ValidationError, fields: dict[str, str]) -> ApiError:
    """The console's wording for msgspec's refusal of one field, worked out from its value."""
    found = _FIELD_AT.search(str(e))
    name = (found.group(1) or found.group(2)) if found else ""
    struct = cast("msgspec.inspect.StructType", msgspec.inspect.type_info(kind))
    info = {f.encode_name: f for f in struct.fields}.get(name)
    if info is None:
        return ApiError(ErrorKind.INVALID, f"the body is refused: {e}")
    value = fields.get(name, "")
    limit = getattr(info.type, "max_length", None)
    if info.required and not value.strip():
        return invalid(name, f"{name} is required")
    if limit is not None and len(value) > limit:
        return invalid(name, f"{name} is longer than {limit} characters")
    wrong = _WRONG_FORM.get(name)
    return invalid(name, wrong(value) if wrong else f"{name} is refused: {e}")


async def read_fields(request: Request) -> dict[str, str]:
    """A JSON object or a urlencoded form, as strings; anything else is a clear ``invalid``."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(ErrorKind.TOO_LARGE, f"request body over {MAX_BODY_BYTES} bytes")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not raw.strip():
        return {}
    if ctype == "application/json":
        return _json_fields(raw)
    if ctype == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError) as e:
            raise ApiError(ErrorKind.INVALID, f"the form is malformed: {e}") from None
        return dict(pairs)
    raise ApiError(ErrorKind.INVALID, "send application/json or application/x-www-form-urlencoded")


def _json_fields(raw: bytes) -> dict[str, str]:
    """A JSON object's members as text (null ones left out); a list or an object as a value is refused."""
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise ApiError(ErrorKind.INVALID, f"the body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ApiError(ErrorKind.INVALID, "the body must be a JSON object")
    out: dict[str, str] = {}
    for k, v in doc.items():
        if v is None:
            continue
        if not isinstance(v, str | int | float | bool):
            raise invalid(k, f"field {k!r} must be a string")
        out[k] = str(v) if not isinstance(v, bool) else ("true" if v else "false")
    return out
