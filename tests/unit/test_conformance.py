"""The conformance corpus (schemas/conformance): loopwire's decoder and an independent JSON Schema validator agree.

Every valid record passes ``decode_event`` (ephemeral ones ``decode_live_strict``) and the schemas; every
invalid one is refused by the decoder, and by the schemas too unless it is marked ``"json_schema": false``
— those break a rule JSON Schema cannot express, and each is listed in docs/protocol.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final

import jsonschema
import pytest
from jsonschema import Draft202012Validator
from jsonschema_specifications import REGISTRY

from shared.codec import DEFAULT_MAX_RECORD_BYTES, decode_event, decode_live_strict
from shared.decoderrules import RULES
from shared.errors import LoopwireError
from shared.events import EVENT_TYPES, Event

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
CORPUS = SCHEMAS / "conformance"
PROTOCOL_MD = ROOT / "docs" / "protocol.md"
UNEXPRESSIBLE_HEADING = "## Rules a schema cannot express"
ENDURING_SCHEMA = "events/EnduringEvent.json"
EPHEMERAL_SCHEMA = "events/EphemeralEvent.json"


def _cases(kind: str) -> list[Path]:
    return sorted((CORPUS / kind).glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def _record_bytes(case: dict[str, Any]) -> bytes:
    if "record_text" in case:
        return str(case["record_text"]).encode()
    return json.dumps(case["record"], ensure_ascii=False).encode()


def _record_value(case: dict[str, Any]) -> Any:
    # A JSON Schema validator sees the parsed document (a duplicate key keeps its last value).
    return json.loads(case["record_text"]) if "record_text" in case else case["record"]


@cache
def _validator(rel: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / rel).read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _schema_errors(rel: str, value: Any) -> list[str]:
    return [e.message for e in _validator(rel).iter_errors(value)]


def _decode(case: dict[str, Any]) -> Event:
    data = _record_bytes(case)
    if case["schema"] == EPHEMERAL_SCHEMA:
        return decode_live_strict(data)
    # A case may say the record size limit it is judged with (LW_MAX_RECORD_BYTES).
    return decode_event(data, max_bytes=case.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))


@pytest.mark.parametrize("path", _cases("valid"), ids=lambda p: p.stem)
def test_valid_record_passes_decoder_and_schemas(path: Path) -> None:
    case = _load(path)
    event = _decode(case)
    value = _record_value(case)
    for rel in (case["schema"], "events/AnyEvent.json", f"events/{type(event).__name__}.json"):
        assert _schema_errors(rel, value) == [], rel


@pytest.mark.parametrize("path", _cases("invalid"), ids=lambda p: p.stem)
def test_invalid_record_is_refused(path: Path) -> None:
    case = _load(path)
    with pytest.raises(LoopwireError):
        _decode(case)
    errors = _schema_errors(case["schema"], _record_value(case))
    if case["json_schema"]:
        assert errors, f"the schema accepts a record breaking: {case['breaks']}"
    else:
        # Honestly marked: the schema cannot say it, so it accepts; the docs list the rule.
        assert errors == [], errors
        assert case["breaks"] in _unexpressible_section(), case["breaks"]


def _unexpressible_section() -> str:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    start = text.index(UNEXPRESSIBLE_HEADING)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_corpus_covers_every_type_and_rule_group() -> None:
    valid = [_load(p) for p in _cases("valid")]
    invalid = [_load(p) for p in _cases("invalid")]
    valid_types = {c["record"]["type"] for c in valid}
    assert valid_types == set(EVENT_TYPES)
    assert len(invalid) >= 60
    assert sum(1 for c in invalid if c["json_schema"]) >= 60
    groups = {c["rule_of"] for c in invalid}
    assert {"envelope", "identity profile", "event table", "StepDone group rule", "ephemeral events"} <= groups
    broken_types = {c["record"]["type"] for c in invalid if isinstance(c.get("record"), dict) and "type" in c["record"]}
    assert set(EVENT_TYPES) <= broken_types
    for c in invalid:
        assert c["breaks"] and c["schema"] in (ENDURING_SCHEMA, EPHEMERAL_SCHEMA)


@pytest.mark.parametrize(
    "slug",
    [
        "v-7",
        "loop-id-not-uuid",
        "created-at-yesterday",
        "step-messages-empty",
        "step-starts-with-tool-result",
        "turn-index-negative",
        "gate-action-maybe",
    ],
)
def test_schemas_alone_refuse_the_reported_records(slug: str) -> None:
    case = _load(CORPUS / "invalid" / f"{slug}.json")
    assert case["json_schema"] is True
    assert _schema_errors(case["schema"], case["record"])


def _listed_rules() -> list[str]:
    return re.findall(r"^- \*\*(.+?)\*\*", _unexpressible_section(), flags=re.M)


def test_the_docs_list_the_decoders_rules_no_schema_expresses() -> None:
    # shared.decoderrules is the decoder's list; docs/protocol.md must say exactly it, in its order.
    assert _listed_rules() == [r.name for r in RULES]


def test_every_unexpressible_rule_has_a_case() -> None:
    marked = {_load(p)["breaks"] for p in _cases("invalid") if not _load(p)["json_schema"]}
    assert marked == {r.name for r in RULES}


# --- the schemas compile under a strict draft 2020-12 reading --------------------------------------------

_VOCABULARIES = ("core", "applicator", "unevaluated", "validation", "meta-data", "format-annotation", "content")
_ONE_SCHEMA = frozenset(
    {
        "additionalProperties",
        "items",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})


@cache
def _keywords() -> frozenset[str]:
    words: set[str] = set()
    for vocab in _VOCABULARIES:
        meta = REGISTRY.contents(f"https://json-schema.org/draft/2020-12/meta/{vocab}")
        words |= set(meta["properties"])
    return frozenset(words)


# Keywords that only apply to one instance type: a strict reader (ajv's strictTypes) wants that type declared.
_TYPED_KEYWORDS = {
    "string": {"pattern", "minLength", "maxLength", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "propertyNames", "patternProperties"},
}


def _unknown_keywords(node: Any, where: str) -> Iterator[str]:
    if isinstance(node, bool):
        return
    assert isinstance(node, dict), where
    for type_, words in _TYPED_KEYWORDS.items():
        numeric = type_ == "integer" and node.get("type") == "number"  # the same keywords apply to both
        if words & node.keys() and node.get("type") != type_ and not numeric:
            yield f"{where}: {sorted(words & node.keys())} without type {type_}"
    for key, value in node.items():
        if key not in _keywords():
            yield f"{where}/{key}"
        elif key in _ONE_SCHEMA:
            yield from _unknown_keywords(value, f"{where}/{key}")
        elif key in _SCHEMA_LISTS:
            for i, sub in enumerate(value):
                yield from _unknown_keywords(sub, f"{where}/{key}/{i}")
        elif key in _SCHEMA_MAPS:
            for name, sub in value.items():
                yield from _unknown_keywords(sub, f"{where}/{key}/{name}")
        elif key == "format":
            assert value in Draft202012Validator.FORMAT_CHECKER.checkers, f"{where}: unknown format {value}"


def _schema_files() -> list[Path]:
    return sorted(p for p in SCHEMAS.rglob("*.json") if CORPUS not in p.parents and p.name != "index.json")


@pytest.mark.parametrize("path", _schema_files(), ids=lambda p: str(p.relative_to(SCHEMAS)))
def test_schema_is_strict_draft_2020_12(path: Path) -> None:
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert list(_unknown_keywords(schema, "#")) == []
    # Every pattern is a valid regular expression with the same meaning in ECMA 262 and Python.
    for pattern in re.findall(r'"pattern": ("(?:[^"\\]|\\.)*")', path.read_text(encoding="utf-8")):
        re.compile(json.loads(pattern))


def test_strict_check_catches_an_unknown_keyword() -> None:
    assert list(_unknown_keywords({"type": "object", "discriminator": {"propertyName": "type"}}, "#")) == [
        "#/discriminator"
    ]
    assert list(_unknown_keywords({"type": "object", "properties": {"a": {"x-hint": 1}}}, "#")) == [
        "#/properties/a/x-hint"
    ]
    assert list(_unknown_keywords({"pattern": "^a$"}, "#")) == ["#: ['pattern'] without type string"]


def test_format_checking_is_on() -> None:
    assert "date-time" in Draft202012Validator.FORMAT_CHECKER.checkers
    with pytest.raises(jsonschema.ValidationError):
        _validator("events/LoopIdle.json").validate(
            {
                "type": "LoopIdle",
                "loop_id": "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c11",
                "event_id": "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c12",
                "created_at": "2026-02-30T00:00:00Z",
            }
        )


# --- beyond the corpus: mutated records -------------------------------------------------------------------

_MUTANTS = 1500
_VALUES: list[Any] = [
    "",
    "x",
    " ",
    "\n",
    "0f3c9a52-1b7e-4c1a-9e55-2d6b8f0a7c11",
    "0F3C9A52-1B7E-4C1A-9E55-2D6B8F0A7C11",
    "2026-01-15T09:30:00Z",
    "2026-02-29T00:00:00Z",
    0,
    1,
    -1,
    255,
    256,
    1_000_001,
    2**64,
    1.5,
    True,
    None,
    [],
    {},
    ["x"],
    {"a": 1},
    "allow",
    "approve",
    "abandoned",
    "tool_use",
    "assistant",
    "tool",
    "permission",
    "unknown",
    "policy_allow",
    "*",
    "a" * 600,
    "é" * 400,
    "l\n" * 25,
    {"role": "tool", "tool_use_id": "toolu_1"},
    {"role": "assistant"},
    {"type": "text", "text": "t"},
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


# Fields whose values only the decoder judges in full: those of the rules no schema expresses.
_DECODER_ONLY: Final = {judged for rule in RULES for judged in rule.judges}


def _scalars(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for v in node.values():
            yield from _scalars(v)
    elif isinstance(node, list):
        for v in node:
            yield from _scalars(v)
    else:
        yield node


def test_mutated_records_the_schema_refuses_the_decoder_refuses() -> None:
    """Random edits of the valid records: the schema is never stricter than the decoder, and for every
    field but those of _DECODER_ONLY the two agree exactly. An edit sets a value from a fixed list, or
    one from elsewhere in the record (which is how a rule relating two fields gets broken), or deletes."""
    import copy
    import random

    rng = random.Random(20260115)
    cases = [_load(p) for p in _cases("valid")]
    checked = disagreements = 0
    for _ in range(_MUTANTS):
        case = copy.deepcopy(rng.choice(cases))
        record = case["record"]
        path = rng.choice(list(_paths(record)))
        parent = record
        for k in path[:-1]:
            parent = parent[k]
        edit = rng.random()
        if isinstance(parent, dict) and edit < 0.2:
            del parent[path[-1]]
        elif edit < 0.5:
            parent[path[-1]] = copy.deepcopy(rng.choice(list(_scalars(record))))
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(_VALUES))
        try:
            _decode(case)
            decoded = True
        except LoopwireError:
            decoded = False
        schema_ok = _validator(case["schema"]).is_valid(record)
        checked += 1
        if decoded != schema_ok:
            assert not decoded and schema_ok, f"the schema refuses what the decoder accepts: {record}"
            value = parent.get(path[-1]) if isinstance(parent, dict) else parent[path[-1]]
            integral_float = isinstance(value, float) and value.is_integer()  # the integer-literal rule
            assert (record["type"], path[0]) in _DECODER_ONLY or integral_float, record
            disagreements += 1
    assert checked == _MUTANTS and disagreements < checked // 10
