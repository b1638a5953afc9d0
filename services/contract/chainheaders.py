"""The digest chain headers of a history record (shared.chain), as the contract documents them."""

from __future__ import annotations

from typing import Any, Final

from services.contract.catalog import JSON_SCHEMA_DIALECT
from shared import subjects
from shared.chain import GENESIS, START, chain_headers
from shared.codec import encode_event
from shared.content import user_text
from shared.events import Cause, Event, InputSubmitted, LoopStarted

DIGEST_PATTERN: Final = "^[0-9a-f]{64}$"

RULE: Final = (
    "Every record the committer stores in a loop's history carries three headers chaining it to the "
    f"record before it in the same loop. {subjects.H_DIGEST} = lowercase hex SHA-256 over: the index in "
    "decimal ASCII, a line feed (0x0A), the previous digest (64 lowercase hex characters), a line feed, then the "
    "payload bytes exactly as stored (the durable envelope, unchanged). The first record of a loop has "
    f"index 1 and prev {GENESIS} (64 zeros); "
    f"each next one has index + 1 and prev = the {subjects.H_DIGEST} of the record before it. A fork's first "
    "record (LoopForked) continues its source's chain: prev = the digest of the source's record at source_seq, "
    "index = that record's index + 1. Records stored before digests existed carry none of the three: they are "
    "unchained, and a chain then starts at the first digested record (index 1 after the genesis value)."
)

PROPERTIES: Final = {
    subjects.H_CHAIN_INDEX: (
        "string",
        "the record's place in its loop's chain, a decimal number from 1 (a fork's continues its source's)",
    ),
    subjects.H_DIGEST_PREV: ("string", f"the {subjects.H_DIGEST} of the loop's record before it (64 zeros first)"),
    subjects.H_DIGEST: (
        "string",
        "SHA-256 (lowercase hex) of: index, line feed, prev, line feed, the payload as stored",
    ),
}


def chain_headers_schema() -> dict[str, Any]:
    """schemas/history/ChainHeaders.json: the chain headers as a JSON object of header name → value."""
    props: dict[str, Any] = {}
    for name, (_, description) in PROPERTIES.items():
        p: dict[str, Any] = {"type": "string", "description": description}
        p["pattern"] = "^[1-9][0-9]*$" if name == subjects.H_CHAIN_INDEX else DIGEST_PATTERN
        props[name] = p
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "ChainHeaders",
        "description": RULE,
        "type": "object",
        "properties": props,
        "required": list(PROPERTIES),
    }


def _example_payloads() -> list[bytes]:
    """A loop's first records as the committer stores them (fixed ids and times: a stable example)."""
    loop_id, command_id = "6f1c2a4e-8b3d-4c5e-9f70-1a2b3c4d5e6f", "0d9e8f7a-6b5c-4d3e-8f21-0a1b2c3d4e5f"
    events: list[Event] = [
        LoopStarted(loop_id=loop_id, model="demo", event_id="3a7b9c1d-2e4f-4a6b-8c0d-1e2f3a4b5c6d"),
        InputSubmitted(
            loop_id=loop_id,
            message=user_text("what is 17*23?"),
            cause=Cause(command_id=command_id),
            event_id="5c8d0e2f-4a6b-4c8d-9e0f-2a3b4c5d6e7f",
        ),
    ]
    for e in events:
        e.created_at = "2026-01-01T00:00:00Z"
    return [encode_event(e) for e in events]


def chained_record_schema() -> dict[str, Any]:
    """schemas/history/ChainedRecord.json: a stored record (payload and chain headers), with a worked
    example of a loop's first records that any implementation can check its digests against."""
    payloads = _example_payloads()
    headers, _ = chain_headers(START, payloads)
    examples = [{"payload": p.decode("utf-8"), "headers": h} for p, h in zip(payloads, headers, strict=True)]
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "ChainedRecord",
        "description": "One stored history record: its payload (the stored bytes, UTF-8) and its chain headers. "
        "The examples are a loop's first records in order: SHA-256 of index, a line feed, prev, a line feed and "
        "the payload's bytes gives each Lw-Digest, and each record's prev is the digest before it.",
        "type": "object",
        "properties": {"payload": {"type": "string"}, "headers": {"$ref": "#/$defs/ChainHeaders"}},
        "required": ["payload", "headers"],
        "examples": examples,
        "$defs": {"ChainHeaders": {k: v for k, v in chain_headers_schema().items() if k != "$schema"}},
    }
