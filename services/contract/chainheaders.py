"""The digest chain headers of a history record (shared.chain), as the contract documents them."""

from __future__ import annotations

from typing import Any, Final

from services.contract.catalog import JSON_SCHEMA_DIALECT
from shared import subjects
from shared.chain import GENESIS

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
