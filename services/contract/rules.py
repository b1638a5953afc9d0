"""What the published JSON Schemas say beyond msgspec's output: the decoder's rules, in standard keywords.

msgspec's schema of a Struct carries every field's type and constraint (``shared.wiretypes``), but not
the rules ``shared.validate`` adds around them. :func:`refine` rewrites the generated definitions so a
JSON Schema validator refuses what ``decode_event`` refuses wherever JSON Schema can say it:

* every titled annotated type (``Uuid``, ``TurnFailedKind``...) becomes one named definition;
* a field whose default breaks its own constraint (``gate_id: Uuid = ""``, ``turn_index: TurnIndex = 0``,
  ``action: GateAction = UNSET``) is required: absent, it is refused on decode;
* identity profiles: which ids each event must carry and which must be empty;
* the body rules (StepDone's group shape, non-empty input messages, ``cause.command_id``...);
* only draft 2020-12 keywords: msgspec's OpenAPI ``discriminator`` is dropped.

What JSON Schema cannot express is ``shared.decoderrules.RULES``, listed in docs/protocol.md ("Rules a
schema cannot express").
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, Final

import msgspec

from shared import wiretypes
from shared.eventkinds import Class, Profile
from shared.events import CLASSIFICATION
from shared.validate import MAX_STEP_MESSAGES

Ref = Callable[[str], str]

# Annotated types the rules below refer to by name (their definitions are added where needed).
_NAMED: Final[dict[str, Any]] = {
    "Uuid": wiretypes.Uuid,
    "UuidOrEmpty": wiretypes.UuidOrEmpty,
    "Rfc3339": wiretypes.Rfc3339,
}
_EMPTY: Final = {"const": ""}
# msgspec requires a struct's tag only where it picks a member of a union: a message decoded as one
# type (InputSubmitted.message, TurnDone.message...) may leave "role" out, one in StepDone.messages may not.
_MESSAGES: Final = ("UserMessage", "SystemMessage", "AIMessage", "ToolResultMessage")
_ROLE_REQUIRED: Final = {"type": "object", "properties": {"role": {"type": "string"}}, "required": ["role"]}
_NON_EMPTY_BLOCKS: Final = {
    "type": "object",
    "required": ["blocks"],
    "properties": {"blocks": {"type": "array", "minItems": 1}},
}


def refine(defs: dict[str, Any], ref: Ref) -> dict[str, Any]:
    """The definitions with every rule applied (a new dict; ``defs`` is left alone)."""
    out = copy.deepcopy(defs)
    for node in out.values():
        _require_unmet_defaults(node)
    for name, node in out.items():
        _body_rules(name, node, ref)
    for cls, (klass, _scope, profile, _ends) in CLASSIFICATION.items():
        if cls.__name__ in out:
            _profile(out[cls.__name__], klass, profile, ref)
    named: dict[str, Any] = {}
    for node in out.values():
        _hoist_titled(node, named, ref, top=True)
    for name, node in named.items():
        if name in out and out[name] != node:
            raise ValueError(f"two different definitions named {name}")
        out[name] = node
    for name in _NAMED:
        if name not in out and _mentions(out, ref(name)):
            out[name] = _named_def(name)
    return {k: strip_discriminators(v) for k, v in sorted(out.items())}


def strip_discriminators(node: Any) -> Any:
    """``node`` without OpenAPI's ``discriminator`` (not a JSON Schema keyword; ``anyOf`` says it all)."""
    if isinstance(node, dict):
        return {k: strip_discriminators(v) for k, v in node.items() if k != "discriminator"}
    if isinstance(node, list):
        return [strip_discriminators(v) for v in node]
    return node


def for_asyncapi(node: Any) -> Any:
    """``node`` in AsyncAPI's schema dialect (a superset of draft-07): tuples as ``items`` + ``additionalItems``."""
    if isinstance(node, list):
        return [for_asyncapi(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: for_asyncapi(v) for k, v in node.items()}
    if "prefixItems" in out:
        out["items"], rest = out.pop("prefixItems"), out.get("items")
        if rest is not None:
            out["additionalItems"] = rest
    return out


def reachable(tops: list[Any], defs: dict[str, Any], ref: Ref) -> dict[str, Any]:
    """Only the definitions ``tops`` refer to, directly or not."""
    prefix = ref("")
    keep: set[str] = set()
    todo = list(tops)
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            target = node.get("$ref")
            if isinstance(target, str) and target.startswith(prefix):
                name = target[len(prefix) :]
                if name not in keep and name in defs:
                    keep.add(name)
                    todo.append(defs[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return {k: v for k, v in defs.items() if k in keep}


# --- defaults ---------------------------------------------------------------------------------------


def _require_unmet_defaults(node: dict[str, Any]) -> None:
    props = node.get("properties")
    if not isinstance(props, dict):
        return
    required = list(node.get("required", []))
    for field, schema in props.items():
        if "default" in schema and not _satisfies(schema, schema["default"]):
            del schema["default"]
            if field not in required:
                required.append(field)
    node["required"] = required


def _satisfies(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` meets the constraints msgspec writes (enum, pattern, lengths, bounds)."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, str):
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return False
        if len(value) < schema.get("minLength", 0):
            return False
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
    if "anyOf" in schema:
        return any(_satisfies(s, value) for s in schema["anyOf"] if isinstance(s, dict) and "$ref" not in s)
    return True


# --- named definitions --------------------------------------------------------------------------------


def _named_def(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(_NAMED[name])
    return schema


def _hoist_titled(node: Any, named: dict[str, Any], ref: Ref, *, top: bool) -> Any:
    """Replace every nested titled (annotated) type by a reference to its own definition."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            node[i] = _hoist_titled(v, named, ref, top=False)
        return node
    if not isinstance(node, dict):
        return node
    for k, v in list(node.items()):
        node[k] = _hoist_titled(v, named, ref, top=False)
    if top or "title" not in node or node.get("type") == "object":
        return node
    body = {k: v for k, v in node.items() if k != "default"}
    if "type" not in body and _STRING_KEYWORDS & body.keys():
        body["type"] = "string"  # msgspec leaves it out for dict keys; strict validators want it
    title = body["title"]
    if named.setdefault(title, body) != body:
        raise ValueError(f"two different types titled {title}")
    out: dict[str, Any] = {"$ref": ref(title)}
    if "default" in node:
        out["default"] = node["default"]
    return out


_STRING_KEYWORDS: Final = frozenset({"pattern", "minLength", "maxLength", "format"})


def _mentions(node: Any, target: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == target or any(_mentions(v, target) for v in node.values())
    if isinstance(node, list):
        return any(_mentions(v, target) for v in node)
    return False


# --- identity profiles --------------------------------------------------------------------------------

_ID_FIELDS: Final = ("loop_id", "turn_id", "step_id", "tool_execution_id")
_LEVEL: Final = {Profile.LOOP: 1, Profile.TURN: 2, Profile.STEP: 3, Profile.GATE: 3, Profile.TOOL: 4}


def _profile(node: dict[str, Any], klass: Class, profile: Profile, ref: Ref) -> None:
    """Which ids must be set (a UUID, required) and which must be empty ("" or absent)."""
    props: dict[str, Any] = node["properties"]
    required: list[str] = node["required"]
    must_set = list(_ID_FIELDS[: _LEVEL[profile]])
    for field in _ID_FIELDS:
        if field in must_set:
            props[field] = {"$ref": ref("Uuid")}
            required.append(field)
        elif field == "tool_execution_id" and profile is Profile.GATE:
            props[field] = {"$ref": ref("UuidOrEmpty"), "default": ""}
        else:
            props[field] = {**_EMPTY, "default": ""}
    props["session_id"] = {"$ref": ref("UuidOrEmpty"), "default": ""}
    if klass is Class.ENDURING:
        props["event_id"] = {"$ref": ref("Uuid")}
        props["created_at"] = {"$ref": ref("Rfc3339")}
        required += ["event_id", "created_at"]
    else:
        props["event_id"] = {"$ref": ref("UuidOrEmpty"), "default": ""}
        props["created_at"] = {"anyOf": [_EMPTY, {"$ref": ref("Rfc3339")}], "default": ""}
    order = ["type", "v", *must_set, "event_id", "created_at"]
    node["required"] = sorted(dict.fromkeys(required), key=lambda f: (order.index(f) if f in order else len(order), f))


# --- body rules ---------------------------------------------------------------------------------------


def _input_message(ref: Ref) -> dict[str, Any]:
    return {"allOf": [{"$ref": ref("UserMessage")}, _NON_EMPTY_BLOCKS]}


def _body_rules(name: str, node: dict[str, Any], ref: Ref) -> None:
    props = node.get("properties", {})
    required: list[str] = node.get("required", [])

    def need(*fields: str) -> None:
        for f in fields:
            props[f].pop("default", None)
            if f not in required:
                required.append(f)

    if name == "InputSubmitted":
        props["message"] = _input_message(ref)
        props["cause"] = {
            "allOf": [
                {"$ref": ref("Cause")},
                {
                    "type": "object",
                    "required": ["command_id"],
                    "properties": {"command_id": {"type": "string", "minLength": 1}},
                },
            ]
        }
        need("message", "cause")
    elif name in ("TurnStarted", "TurnFoldedInto"):
        props["message"] = _input_message(ref)
        need("message")
    elif name == "StepDone":
        # The group rule's shape: [assistant message] + one tool result per tool use (pairing: docs).
        props["messages"] = {
            "type": "array",
            "prefixItems": [{"allOf": [{"$ref": ref("AIMessage")}, _ROLE_REQUIRED]}],
            "items": {"allOf": [{"$ref": ref("ToolResultMessage")}, _ROLE_REQUIRED]},
            "minItems": 1,
            "maxItems": MAX_STEP_MESSAGES,
        }
        need("messages")
    elif name in _MESSAGES:
        node["required"] = [f for f in required if f != "role"]
    elif name in ("PermissionRequested", "GateOpened"):
        need("request" if name == "PermissionRequested" else "gate")
    elif name == "Limits":
        count = props["max_result_bytes"]
        props["max_result_bytes"] = {
            "description": "0 = unbounded, else at least 256.",
            "allOf": [count],
            "anyOf": [{"const": 0}, {"type": "integer", "minimum": 256}],
            "default": count.pop("default", 0),
        }
    elif name == "CommitRequest":
        props["events"] = {**props["events"], "minItems": 1, "maxItems": 1000}
