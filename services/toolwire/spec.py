"""What a tool declares about itself: the spec workers register and callers route by.

The spec is the unit of discovery (KV ``<prefix>_tools``) and what the model sees (name, description,
``input_schema``). Everything the *caller* needs to schedule a call without a round trip lives here:
``sequential``, the write-target argument and the default timeout.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from shared.events import RetryPolicy
from shared.wiretypes import TOOL_NAME_PATTERN

TOOL_NAME_RE: Final = re.compile(TOOL_NAME_PATTERN)

KIND_FUNCTION: Final = "function"
KIND_USER_INPUT: Final = "user_input"
# A sub-agent: each call runs a child loop (services/tools/agent.py); served by a worker like a function.
KIND_AGENT: Final = "agent"
KINDS: Final = (KIND_FUNCTION, KIND_USER_INPUT, KIND_AGENT)

DEFAULT_TIMEOUT_SECONDS: Final = 60.0


def valid_tool_name(name: str) -> bool:
    """A tool name is one subject token: letters, digits, ``_`` and ``-``, 1-64 characters."""
    return bool(TOOL_NAME_RE.fullmatch(name))


class ToolSpec(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A tool's declaration. Unknown fields are ignored on decode so newer workers stay readable.

    ``write_target`` names a top-level argument field (e.g. ``"path"``); calls of a batch whose value
    for that field is equal are serialised in call order (the caller computes the key from the raw
    arguments, no round trip). ``has_write_target`` is ``write_target != ""``.
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    version: str = "1"
    sequential: bool = False
    has_write_target: bool = False
    write_target: str = ""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    kind: str = KIND_FUNCTION
    # Safety annotations (the meaning of MCP's tool annotations). An unannotated tool is treated as
    # possibly destructive: it is never run twice (see docs/tools.md, "Run at most once").
    read_only: bool = False  # no side effects
    idempotent: bool = False  # running it again with the same arguments has no further effect
    destructive: bool = False  # may delete or overwrite
    open_world: bool = False  # reaches outside systems (network, other services)
    retry: RetryPolicy | None = None  # None: the default for its annotations (see default_retry)

    @property
    def rerun_safe(self) -> bool:
        """Running a call again whose first outcome is unknown does no harm."""
        return self.read_only or self.idempotent

    # Which server serves the tool (e.g. "mcp:time" for a bridged MCP server; "" = a loopwire worker),
    # and whether that backend is up (a bridge whose server restarts registers healthy=false).
    source: str = ""
    healthy: bool = True

    def compatibility_key(self) -> bytes:
        """What must agree between replicas of one tool (description and timeout may differ)."""
        return msgspec.json.encode(
            [self.version, self.input_schema, self.sequential, self.write_target, self.kind], order="sorted"
        )


# Retried by default: read-only and idempotent tools; never: the others (a retry could repeat an effect).
# Four attempts over about 3.5 s of backoff: long enough for a restarted worker to register again.
DEFAULT_RERUN_SAFE_RETRY: Final = RetryPolicy(max_attempts=4, initial_backoff_seconds=0.5, max_backoff_seconds=4.0)
NO_RETRY: Final = RetryPolicy(max_attempts=1)


def retry_policy(spec: object, override: RetryPolicy | None = None) -> RetryPolicy:
    """The retry policy of a call: none unless the tool is read-only or idempotent; else the loop's
    override, the tool's own declaration, or the default."""
    if not (getattr(spec, "read_only", False) or getattr(spec, "idempotent", False)):
        return NO_RETRY
    declared = getattr(spec, "retry", None)
    return override or declared or DEFAULT_RERUN_SAFE_RETRY


class Registration(msgspec.Struct, kw_only=True):
    """The KV value a worker keeps under ``<tool_name>.<worker_id>`` while it serves the tool."""

    worker_id: str
    spec: ToolSpec
    host: str = ""
    pid: int = 0
    started_at: str = ""


def input_schema_of(input_type: type) -> dict[str, Any]:
    """JSON Schema of an input Struct, with the top-level object inlined (models want an object schema)."""
    schema: dict[str, Any] = msgspec.json.schema(input_type)
    ref = schema.get("$ref")
    defs: dict[str, Any] = dict(schema.get("$defs", {}))
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    top = ref[len("#/$defs/") :]
    body = dict(defs.get(top, {}))
    others = {k: v for k, v in defs.items() if k != top}
    # A self-referencing input keeps its own definition so the "$ref" still resolves.
    if ref.encode() in msgspec.json.encode([body, others]):
        others[top] = defs[top]
    if others:
        body["$defs"] = others
    return body
