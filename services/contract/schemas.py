"""The JSON Schema files under schemas/: one self-contained draft 2020-12 schema per wire type, plus index.json."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from services.contract import rules
from services.contract.catalog import (
    ANY_UNION,
    API_TYPES,
    COMMIT_TYPES,
    CONFORMANCE_DIR,
    DESCRIPTIONS,
    ENDURING_UNION,
    EPHEMERAL_UNION,
    JSON_SCHEMA_DIALECT,
    LIVE_FRAME,
    TOOL_TYPES,
)
from services.contract.chainheaders import chain_headers_schema, chained_record_schema
from shared import protocol
from shared.events import EVENT_TYPES

_FILE_NAME: Final = {"ToolErrorBody": "ErrorBody"}


def components(types: Iterable[Any], ref_template: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """msgspec's schemas of ``types`` and their definitions, refined by :mod:`services.contract.rules`."""
    tops, defs = msgspec.json.schema_components(list(types), ref_template=ref_template)
    defs = rules.refine(defs, lambda name: ref_template.format(name=name))
    return rules.strip_discriminators(list(tops)), defs


def document_commit_events(defs: dict[str, Any], union_schema: dict[str, Any]) -> None:
    """CommitRequest.events is raw JSON in the code (validated one by one): document it as envelopes."""
    props = defs["CommitRequest"]["properties"]["events"]
    props["items"] = union_schema
    props["description"] = "Durable envelopes of enduring events, in order."
    defs["CommitRequest"]["properties"]["chain"]["description"] = (
        "Store the events one by one, each right after the one before, up to the first whose expected "
        "sequence fails (the reply's seqs are the stored ones), instead of all or none."
    )


def standalone_schema(name: str, type_: Any) -> dict[str, Any]:
    """One self-contained JSON Schema (draft 2020-12) for ``type_``."""
    extra = [ENDURING_UNION] if type_ is protocol.CommitRequest else []
    tops, defs = components([type_, *extra], "#/$defs/{name}")
    if extra:
        document_commit_events(defs, tops[1])
    doc: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT, "title": name}
    if name in DESCRIPTIONS:
        doc["description"] = DESCRIPTIONS[name]
    doc.update(tops[0])
    doc["$defs"] = rules.reachable([tops[0]], defs, lambda n: f"#/$defs/{n}")
    return doc


def schema_files() -> dict[str, dict[str, Any]]:
    """Relative path under schemas/ → schema, for every event and protocol message."""
    files: dict[str, dict[str, Any]] = {}
    for name, cls in EVENT_TYPES.items():
        files[f"events/{name}.json"] = standalone_schema(name, cls)
    files["events/EnduringEvent.json"] = standalone_schema("EnduringEvent", ENDURING_UNION)
    files["events/EphemeralEvent.json"] = standalone_schema("EphemeralEvent", EPHEMERAL_UNION)
    files["events/LiveFrame.json"] = standalone_schema("LiveFrame", LIVE_FRAME)
    files["events/AnyEvent.json"] = standalone_schema("AnyEvent", ANY_UNION)
    for group, types in (("commit", COMMIT_TYPES), ("api", API_TYPES), ("tools", TOOL_TYPES)):
        for t in types:
            name = t.__name__
            files[f"{group}/{_FILE_NAME.get(name, name)}.json"] = standalone_schema(name, t)
    files["history/ChainHeaders.json"] = chain_headers_schema()
    files["history/ChainedRecord.json"] = chained_record_schema()
    return dict(sorted(files.items()))


def dumps_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def render_schemas() -> dict[str, str]:
    """Relative path → file text (schemas plus an index.json listing them)."""
    files = schema_files()
    index = {
        "description": "JSON Schemas of loopwire's wire types, generated from the msgspec types "
        "(loopwire schema --out schemas). See docs/asyncapi.yaml for subjects and headers; "
        "history/ChainHeaders.json for the digest chain every stored history record carries.",
        "envelope_version": 1,
        "files": sorted(files),
        "conformance": f"{CONFORMANCE_DIR}/valid and {CONFORMANCE_DIR}/invalid: records every implementation must "
        "accept / refuse (hand-written; see docs/protocol.md, Conformance corpus).",
    }
    out = {path: dumps_json(doc) for path, doc in files.items()}
    out["index.json"] = dumps_json(index)
    return out
