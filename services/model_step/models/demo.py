"""The demo model — not an LLM.

An offline, deterministic, rule-based stand-in used by ``loopwire demo`` and by tests. It reads
the words of the last user message and, while that message has no tool results after it yet,
asks for the matching tools in ONE step with parallel tool uses (in the order calculator, clock,
kv_memory, read_file; several calls of one tool in text order):

* calculator — every arithmetic expression (``17*23``, ``(3+4) * 5``, ``12 times 7``):
  ``{"expression": "17*23"}``;
* clock — when the text says time / clock / date: one call per city named (Tokyo, London,
  New York, Paris, Berlin, Sydney, UTC, ... or an IANA zone like ``Europe/Lisbon``), else UTC:
  ``{"timezone": "Asia/Tokyo"}``;
* kv_memory — "remember (that) my X is Y", "recall X" / "what is my X", "list memories" /
  "what do you remember": ``{"action": "remember"|"recall"|"list", "key": ..., "value": ...}``;
* read_file — "read / open / show / cat" with a path-like word: ``{"path": "README.md"}``;
* any other tool offered (your own, an MCP server's) — when the words name it (``shout "hello"``,
  ``use everything_echo to say hi``): its required fields filled from the words (a string field gets
  the first quoted text, else the words after the tool's name; number fields the numbers in order).

Only tools present in the request are used. Once results arrive it answers in text composed
from them. A compaction request (docs/context.md) gets a summary listing the user's words.
Every text it writes starts with ``[demo model — not an LLM]``. Tool-use ids are
``toolu_demo_<n>``, numbered by position in the loop's history, so a re-run of the same step
produces the same ids. Output is streamed in several chunks (arguments split across fragments)
with word-count "usage".
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any, Final

import anyio

from services.model_step.models.base import FINISH_END_TURN, FINISH_TOOL_USE, ModelChunk, ModelRequest
from shared.content import AIMessage, Message, ToolResultMessage, ToolUseBlock, Usage, UserMessage, text_of

LABEL: Final = "[demo model — not an LLM]"
TOOL_ORDER: Final = ("calculator", "clock", "kv_memory", "read_file")

CITY_ZONES: Final[dict[str, str]] = {
    "tokyo": "Asia/Tokyo",
    "osaka": "Asia/Tokyo",
    "london": "Europe/London",
    "new york": "America/New_York",
    "paris": "Europe/Paris",
    "berlin": "Europe/Berlin",
    "madrid": "Europe/Madrid",
    "rome": "Europe/Rome",
    "amsterdam": "Europe/Amsterdam",
    "moscow": "Europe/Moscow",
    "sydney": "Australia/Sydney",
    "melbourne": "Australia/Melbourne",
    "auckland": "Pacific/Auckland",
    "los angeles": "America/Los_Angeles",
    "san francisco": "America/Los_Angeles",
    "chicago": "America/Chicago",
    "toronto": "America/Toronto",
    "sao paulo": "America/Sao_Paulo",
    "beijing": "Asia/Shanghai",
    "shanghai": "Asia/Shanghai",
    "hong kong": "Asia/Hong_Kong",
    "singapore": "Asia/Singapore",
    "mumbai": "Asia/Kolkata",
    "delhi": "Asia/Kolkata",
    "dubai": "Asia/Dubai",
    "utc": "UTC",
    "gmt": "UTC",
}
_CITY_RE: Final = re.compile(r"\b(" + "|".join(re.escape(c) for c in CITY_ZONES) + r")\b", re.IGNORECASE)
_ZONE_RE: Final = re.compile(r"\b((?:Africa|America|Asia|Atlantic|Australia|Europe|Indian|Pacific)/[A-Za-z_]+)\b")
_TIME_RE: Final = re.compile(r"\b(time|clock|date|timezone|o'clock)\b", re.IGNORECASE)

_WORD_OPS: Final = (
    (re.compile(r"\bmultiplied\s+by\b", re.IGNORECASE), "*"),
    (re.compile(r"\btimes\b", re.IGNORECASE), "*"),
    (re.compile(r"\bdivided\s+by\b", re.IGNORECASE), "/"),
    (re.compile(r"\bplus\b", re.IGNORECASE), "+"),
    (re.compile(r"\bminus\b", re.IGNORECASE), "-"),
    (re.compile(r"(?<=\d)\s*[x×]\s*(?=\d)"), "*"),
    (re.compile(r"÷"), "/"),
)
_EXPR_RUN: Final = re.compile(r"[0-9.+\-*/%^()\s]+")
_HAS_OP: Final = re.compile(r"[\d)]\s*[-+*/%^]\s*[-(.\d]")

_REMEMBER_RE: Final = re.compile(
    r"\bremember\s+(?:that\s+)?(?:my\s+)?(.+?)\s+(?:is|are|=)\s+(.+?)\s*(?:[.!?;]|\band\b|$)", re.IGNORECASE
)
_RECALL_RE: Final = re.compile(
    r"\b(?:recall|what(?:'s|\s+is|\s+was|\s+are)\s+my)\s+(?:my\s+)?(.+?)\s*(?:[.!?;]|\band\b|$)", re.IGNORECASE
)
_LIST_RE: Final = re.compile(
    r"\b(?:list|show)\b[^.?!]*\bmemor(?:y|ies)\b|\bwhat\s+do\s+you\s+remember\b", re.IGNORECASE
)
_READ_RE: Final = re.compile(r"\b(read|open|show|cat|contents)\b", re.IGNORECASE)
# A word with a file extension (README.md, docs/a.txt) or with a slash (src/main).
_PATH_RE: Final = re.compile(
    r"(?<![\w/.])((?:[\w.-]+/)*[\w-][\w.-]*\.[A-Za-z][A-Za-z0-9]{0,7}|(?:[\w.-]+/)+[\w.-]+)(?![\w/])"
)

_WORDS: Final = re.compile(r"\w+")


def _words(text: str) -> int:
    return len(_WORDS.findall(text))


# --- choosing tools -----------------------------------------------------------------------------


def _expressions(text: str) -> list[str]:
    for pattern, op in _WORD_OPS:
        text = pattern.sub(op, text)
    out: list[str] = []
    for m in _EXPR_RUN.finditer(text):
        expr = m.group().strip().lstrip("+*/%^.").rstrip("+-*/%^. ").strip()
        while expr.startswith("(") and expr.count("(") > expr.count(")"):
            expr = expr[1:].strip()
        while expr.endswith(")") and expr.count(")") > expr.count("("):
            expr = expr[:-1].strip()
        if _HAS_OP.search(expr) and any(c.isdigit() for c in expr):
            out.append(expr)
    return out


def _zones(text: str) -> list[str]:
    if not _TIME_RE.search(text):
        return []
    found: list[tuple[int, str]] = [(m.start(), CITY_ZONES[m.group(1).lower()]) for m in _CITY_RE.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _ZONE_RE.finditer(text)]
    zones = list(dict.fromkeys(z for _, z in sorted(found)))
    return zones or ["UTC"]


def _memory(text: str) -> list[dict[str, str]]:
    if _LIST_RE.search(text):
        return [{"action": "list", "key": "", "value": ""}]
    calls = [{"action": "remember", "key": k.strip(), "value": v.strip()} for k, v in _REMEMBER_RE.findall(text)]
    calls += [{"action": "recall", "key": k.strip(), "value": ""} for k in _RECALL_RE.findall(text)]
    return calls


def _paths(text: str) -> list[str]:
    if not _READ_RE.search(text):
        return []
    return list(dict.fromkeys(m.group(1) for m in _PATH_RE.finditer(text)))


_QUOTED: Final = re.compile(r"\"([^\"]+)\"|'([^']+)'|“([^”]+)”")
_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?")


def _mentions(text: str, name: str) -> re.Match[str] | None:
    """Where ``text`` names the tool ``name`` (as a whole word, in any case)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text, re.IGNORECASE)


def _arguments_for(schema: dict[str, Any], text: str, after: str) -> dict[str, Any]:
    """Arguments for a tool's required fields, from the user's words: a string field takes the first
    quoted text (else the words after the tool's name, else all of them), an enum its first value,
    number fields the numbers of the text in order, a boolean false, a list or object an empty one."""
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list):
        return {}
    quoted = next((next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)), None)
    words = quoted or after.strip(" \t:,.;!?") or text.strip()
    numbers = iter(_NUMBER.findall(text))
    args: dict[str, Any] = {}
    for field in required:
        spec = properties.get(field)
        if not isinstance(field, str) or not isinstance(spec, dict):
            continue
        kind = spec.get("type")
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            args[field] = spec["enum"][0]
        elif kind in ("number", "integer"):
            number = next(numbers, "0")
            args[field] = int(float(number)) if kind == "integer" else float(number)
        elif kind == "boolean":
            args[field] = False
        elif kind == "array":
            args[field] = []
        elif kind == "object":
            args[field] = {}
        else:
            args[field] = words
    return args


def choose_calls(
    text: str, available: Iterable[str], schemas: dict[str, dict[str, Any]] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The (tool name, input) pairs the demo model asks for, given the user's words: the built-in
    tools by their rules, then any other offered tool the words name (with ``schemas`` to fill its
    required arguments)."""
    offered = list(dict.fromkeys(available))
    found: dict[str, list[dict[str, Any]]] = {
        "calculator": [{"expression": e} for e in _expressions(text)],
        "clock": [{"timezone": z} for z in _zones(text)],
        "kv_memory": _memory(text),
        "read_file": [{"path": p} for p in _paths(text)],
    }
    calls: list[tuple[str, dict[str, Any]]] = [
        (name, args) for name in TOOL_ORDER if name in offered for args in found[name]
    ]
    for name in offered:
        if name in TOOL_ORDER:
            continue
        where = _mentions(text, name)
        if where is not None:
            calls.append((name, _arguments_for((schemas or {}).get(name, {}), text, text[where.end() :])))
    return calls


# --- composing output -----------------------------------------------------------------------------


def _text_chunks(text: str, words_per_chunk: int = 4) -> list[ModelChunk]:
    pieces = re.findall(r"\s*\S+\s*", text) or [text]
    return [
        ModelChunk(kind="text", text="".join(pieces[i : i + words_per_chunk]))
        for i in range(0, len(pieces), words_per_chunk)
    ]


def _fragments(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _request_words(request: ModelRequest) -> int:
    return _words(request.system) + sum(_words(text_of(m)) for m in request.messages)


def _result_line(call: ToolUseBlock | None, result: ToolResultMessage) -> str:
    text = text_of(result).strip()
    if call is None:
        return f"a tool returned: {text}"
    try:
        args: Any = json.loads(bytes(call.input))
    except ValueError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    if result.is_error:
        return f"{call.name} failed: {text}"
    if call.name == "calculator":
        return f"{args.get('expression', '?')} = {text}"
    if call.name == "clock":
        return f"the time in {args.get('timezone', 'UTC')} is {text}"
    if call.name == "kv_memory":
        return f"memory ({args.get('action', '?')} {args.get('key', '')}".rstrip() + f"): {text}"
    if call.name == "read_file":
        shown = text if len(text) <= 2000 else text[:2000] + " …"
        return f"{args.get('path', '?')} contains:\n{shown}"
    return f"{call.name} returned: {text}"


def respond(request: ModelRequest) -> list[ModelChunk]:
    """The whole response to a request, as the chunks to stream (pure and deterministic)."""
    messages = request.messages
    if request.compaction:
        return _answer(_summary(messages[:-1]), _request_words(request))
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    since = messages[last_user + 1 :]
    results = [m for m in since if isinstance(m, ToolResultMessage)]
    in_words = _request_words(request)
    if results:
        uses = [b for m in since if isinstance(m, AIMessage) for b in (m.blocks or ()) if isinstance(b, ToolUseBlock)]
        by_id = {b.id: b for b in uses}
        lines = [_result_line(by_id.get(r.tool_use_id), r) for r in results]
        return _answer(f"{LABEL} Here is what I found:\n" + "\n".join(f"- {line}" for line in lines), in_words)

    user_text = text_of(messages[last_user]) if last_user >= 0 else ""
    offered = [t.name for t in request.tools]
    calls = choose_calls(user_text, offered, {t.name: t.input_schema for t in request.tools})
    if not calls:
        have = ", ".join(offered) or "none"
        return _answer(
            f"{LABEL} I only pick tools from your words and none matched (tools I can use here: {have}). "
            'Try "what is 17*23 and what time is it in Tokyo?", "remember that my colour is blue", '
            '"read README.md", or name any of those tools (quote the text it should get).',
            in_words,
        )

    names = list(dict.fromkeys(name for name, _ in calls))
    intro = f"{LABEL} Let me use {' and '.join(names)}."
    chunks = _text_chunks(intro)
    base = sum(1 for m in messages if isinstance(m, AIMessage) for b in (m.blocks or ()) if isinstance(b, ToolUseBlock))
    frags: list[list[str]] = []
    out_words = _words(intro)
    for i, (name, args) in enumerate(calls):
        chunks.append(ModelChunk(kind="tool_use", index=i, id=f"toolu_demo_{base + i + 1}", name=name))
        arguments = json.dumps(args, separators=(",", ":"))
        frags.append(_fragments(arguments))
        out_words += _words(name) + _words(arguments)
    # Fragments of the parallel calls interleave, as a real stream may.
    for round_ in range(max(len(f) for f in frags)):
        for i, f in enumerate(frags):
            if round_ < len(f):
                chunks.append(ModelChunk(kind="tool_use", index=i, text=f[round_]))
    chunks.append(ModelChunk(kind="usage", usage=Usage(input_tokens=in_words, output_tokens=out_words)))
    chunks.append(ModelChunk(kind="finish", finish_reason=FINISH_TOOL_USE))
    return chunks


def _summary(messages: list[Message]) -> str:
    """A compaction request's answer: the user's words, each clipped, the latest last (the
    instruction, the request's last message, is left out by the caller)."""
    asked = [" ".join(text_of(m).split())[:80] for m in messages if isinstance(m, UserMessage)]
    text = f"{LABEL} Summary of {len(messages)} messages. The user wrote: " + " | ".join(asked)
    return text if len(text) <= 600 else text[:300] + " … " + text[-290:]


def _answer(text: str, in_words: int) -> list[ModelChunk]:
    return [
        *_text_chunks(text),
        ModelChunk(kind="usage", usage=Usage(input_tokens=in_words, output_tokens=_words(text))),
        ModelChunk(kind="finish", finish_reason=FINISH_END_TURN),
    ]


class DemoModel:
    """``demo``: the rule-based demo model — not an LLM (see the module docstring)."""

    def __init__(self, *, chunk_delay: float = 0.0) -> None:
        self.name = "demo"
        self.model = ""  # not a provider's model
        self._delay = chunk_delay  # > 0 makes the streaming visible in a live view

    def __repr__(self) -> str:
        return "DemoModel()"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for chunk in respond(request):
            yield chunk
            # A checkpoint per chunk, so an interrupt lands mid-stream like with a real model.
            await anyio.sleep(self._delay)
