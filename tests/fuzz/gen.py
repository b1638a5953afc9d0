"""Hypothesis strategies for the fuzz campaign: random bytes, random JSON and mutated valid messages.

Mutations work on a parsed valid message (drop / add unknown / retype a field, huge strings, deep
nesting, forged ids, wrong ``type`` or ``v``, edge numbers, duplicated list items) and then on its
bytes (duplicate keys, invalid UTF-8, truncation, trailing garbage). Sizes of huge strings and nesting
depths are drawn as numbers and built here, because hypothesis limits how much data one example draws.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from hypothesis import strategies as st

from shared.events import EPHEMERAL_TYPES, EVENT_TYPES
from shared.subjects import VERBS

# Replaced by the loop's current last sequence when a commit case runs (so valid mutations can land).
CURRENT_SEQ: Final = 987654321987
# Largest body sent: the server's max_payload (1 MiB) minus room for the subject and headers.
MAX_BODY: Final = 1024 * 1024 - 2048

HUGE_SIZES: Final = (1_000, 70_000, 300_000, 1_020_000, 1_040_000, 1_046_000)
DEPTHS: Final = (3, 40, 200, 230, 260, 1_000, 20_000)
EDGE_NUMBERS: Final[list[Any]] = [0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 10**30, 0.5, -0.0, 1e308]
WEIRD_STRINGS: Final[list[str]] = [
    "",
    " ",
    "\x00",
    "\x1b[31m",
    "\u2028",
    "\ufeff",
    "\ud800",  # a lone surrogate: json.dumps writes it as the escape \\ud800
    "😀" * 10,
    "é" * 100,
    "\\u0000",
    "null",
    "<script>",
    "../../etc/passwd",
]
BAD_UTF8: Final[list[bytes]] = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\x80", b"\xc0\xaf"]
ID_FIELDS: Final = (
    "loop_id",
    "turn_id",
    "step_id",
    "tool_execution_id",
    "session_id",
    "event_id",
    "command_id",
    "gate_id",
    "id",
    "tool_use_id",
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def dumps(doc: Any, *, ascii_only: bool = True) -> bytes:
    """JSON bytes; lone surrogates survive as escapes (ascii) or as surrogatepass bytes (invalid UTF-8)."""
    return json.dumps(doc, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8", "surrogatepass")


# --- paths into a document -----------------------------------------------------------------------

Path = tuple[str | int, ...]


def paths(doc: Any, prefix: Path = (), limit: int = 400) -> list[Path]:
    """Every path (dict key / list index) in ``doc``, breadth first, at most ``limit``."""
    out: list[Path] = []
    todo: list[tuple[Path, Any]] = [(prefix, doc)]
    while todo and len(out) < limit:
        p, v = todo.pop(0)
        if isinstance(v, dict):
            for k, child in v.items():
                out.append((*p, k))
                todo.append(((*p, k), child))
        elif isinstance(v, list):
            for i, child in enumerate(v):
                out.append((*p, i))
                todo.append(((*p, i), child))
    return out


def get(doc: Any, path: Path) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def put(doc: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    parent = get(doc, path[:-1])
    parent[path[-1]] = value
    return doc


def drop(doc: Any, path: Path) -> Any:
    if not path:
        return doc
    parent = get(doc, path[:-1])
    del parent[path[-1]]
    return doc


def nest(value: Any, depth: int, as_dict: bool) -> Any:
    for _ in range(depth):
        value = {"a": value} if as_dict else [value]
    return value


# --- mutations of a parsed document ---------------------------------------------------------------

Draw = Callable[[st.SearchStrategy[Any]], Any]
DocOp = Callable[[Draw, Any], Any]


def _path(draw: Draw, doc: Any, pred: Callable[[Path, Any], bool] = lambda p, v: True) -> Path | None:
    ps = [p for p in paths(doc) if pred(p, get(doc, p))]
    return draw(st.sampled_from(ps)) if ps else None


def op_drop(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc)
    return drop(doc, p) if p else doc


def op_unknown_field(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: isinstance(v, dict))
    target = get(doc, p) if p else doc
    if isinstance(target, dict):
        target[draw(st.sampled_from(["zz_unknown", "Type", "V", "extra", "LOOP_ID", ""]))] = draw(json_values)
    return doc


def op_retype(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc)
    return put(doc, p, draw(json_values)) if p else draw(json_values)


def op_huge_string(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: isinstance(v, str))
    size = draw(st.sampled_from(HUGE_SIZES))
    char = draw(st.sampled_from(["x", "é", "😀", "\\", '"']))
    return put(doc, p, char * max(1, size // len(char.encode()))) if p else doc


def op_weird_string(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: isinstance(v, str))
    value = draw(st.sampled_from(WEIRD_STRINGS) | st.text(max_size=12))
    return put(doc, p, value) if p else doc


def op_type(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: p[-1] == "type")
    names = sorted(EVENT_TYPES)
    value = draw(
        st.sampled_from(names)
        | st.sampled_from(sorted(EPHEMERAL_TYPES))
        | st.sampled_from(["stepdone", "STEPDONE", "Event", "", "text", "tool_use", "user", "assistant"])
        | json_values
    )
    return put(doc, p, value) if p else doc


def op_version(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: p[-1] == "v")
    value = draw(st.sampled_from([0, 2, -1, "1", 1.0, True, None, 2**64, [1]]))
    if p:
        return put(doc, p, value)
    if isinstance(doc, dict):
        doc["v"] = value
    return doc


def op_forge_id(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: p[-1] in ID_FIELDS)
    if not p:
        return doc
    cur = get(doc, p)
    choices: list[Any] = [str(uuid.uuid4()), "", "x", "00000000-0000-0000-0000-000000000000", "*", "lw.hist.>"]
    if isinstance(cur, str):
        choices += [cur.upper(), cur.replace("-", ""), cur + " ", "{" + cur + "}", cur[:-1]]
    return put(doc, p, draw(st.sampled_from(choices)))


def op_deep(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc)
    depth = draw(st.sampled_from(DEPTHS))
    as_dict = draw(st.booleans())
    if not p:
        return nest(doc, depth, as_dict)
    return put(doc, p, nest(get(doc, p), depth, as_dict))


def op_number(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: isinstance(v, int | float) and not isinstance(v, bool))
    return put(doc, p, draw(st.sampled_from(EDGE_NUMBERS))) if p else doc


def op_list(draw: Draw, doc: Any) -> Any:
    p = _path(draw, doc, lambda p, v: isinstance(v, list) and bool(v))
    if not p:
        return doc
    items = get(doc, p)
    how = draw(st.sampled_from(["dup", "reverse", "empty", "many"]))
    if how == "dup":
        items.append(json.loads(json.dumps(items[draw(st.integers(0, len(items) - 1))])))
    elif how == "reverse":
        items.reverse()
    elif how == "empty":
        items.clear()
    else:
        items.extend(json.loads(json.dumps(items[-1])) for _ in range(draw(st.sampled_from([10, 1001, 3000]))))
    return doc


DOC_OPS: Final[list[DocOp]] = [
    op_drop,
    op_unknown_field,
    op_retype,
    op_huge_string,
    op_weird_string,
    op_type,
    op_version,
    op_forge_id,
    op_deep,
    op_number,
    op_list,
]

# --- mutations of the bytes ------------------------------------------------------------------------


def byte_dup_key(draw: Draw, data: bytes) -> bytes:
    # Repeat the first key of an object (same or other case): "duplicate keys at any depth".
    i = data.find(b'{"')
    if i < 0:
        return data
    j = data.find(b'"', i + 2)
    key = data[i + 2 : j]
    if draw(st.booleans()):
        key = key.swapcase()
    return data[: i + 1] + b'"' + key + b'":' + dumps(draw(json_values)) + b"," + data[i + 1 :]


def byte_bad_utf8(draw: Draw, data: bytes) -> bytes:
    quotes = [k for k, b in enumerate(data) if b == 0x22]
    at = draw(st.sampled_from(quotes)) + 1 if quotes else 0
    return data[:at] + draw(st.sampled_from(BAD_UTF8)) + data[at:]


def byte_truncate(draw: Draw, data: bytes) -> bytes:
    return data[: draw(st.integers(0, max(0, len(data) - 1)))]


def byte_garbage(draw: Draw, data: bytes) -> bytes:
    tail = draw(st.sampled_from([b",", b"}", b"]", b" {}", b"\x00", b"null", b"\xef\xbb\xbf"]))
    return tail + data if draw(st.booleans()) else data + tail


BYTE_OPS: Final = [byte_dup_key, byte_bad_utf8, byte_truncate, byte_garbage]


@st.composite
def mutate(draw: Draw, seed: Any, max_ops: int = 3) -> bytes:
    """A mutated copy of ``seed`` (a parsed JSON document), serialized (maybe mutated again as bytes)."""
    doc = json.loads(json.dumps(seed))
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(DOC_OPS))
        with contextlib.suppress(RecursionError):  # an earlier op nested too deep for json to copy: skip
            doc = op(draw, doc)
    try:
        data = dumps(doc, ascii_only=draw(st.booleans()))
    except RecursionError:  # a very deep document: json cannot write it, send its prefix
        data = b"[" * 50_000
    if draw(st.integers(0, 3)) == 0:
        data = draw(st.sampled_from(BYTE_OPS))(draw, data)
    return data[:MAX_BODY]


def random_body() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=512),
        json_values.map(dumps),
        st.sampled_from([b"", b"{}", b"[]", b"null", b'"x"', b"1e999", b"NaN", b"{" * 300, b"[" * 100_000]),
    )


# --- cases per boundary ----------------------------------------------------------------------------


@dataclass
class Corpus:
    """Valid messages the mutations start from (captured from a real run, see tests.fuzz.env)."""

    loop_id: str = ""  # a loop with history that commit cases target
    envelopes: list[dict[str, Any]] = field(default_factory=list)  # stored records, rewritten to loop_id
    live: list[dict[str, Any]] = field(default_factory=list)  # ephemeral events seen on lw.live.>
    api_bodies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # verb → valid bodies
    api_loops: list[str] = field(default_factory=list)  # started, closed, gated and never-started loop ids
    tool_args: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # tool → valid arguments

    def fresh_ids(self, env: dict[str, Any]) -> dict[str, Any]:
        e = json.loads(json.dumps(env))
        e["event_id"] = str(uuid.uuid4())
        return e


@dataclass
class CommitCase:
    loop_token: str
    body: bytes


@dataclass
class ApiCase:
    loop_token: str
    verb: str
    body: bytes


@dataclass
class ToolCase:
    tool: str
    body: bytes
    headers: dict[str, str]
    deadline_ms: int | None  # relative deadline to put in Lw-Deadline at send time (None: as in headers)


@dataclass
class CodecCase:
    data: bytes


def _loop_tokens(main: list[str]) -> st.SearchStrategy[str]:
    forged = st.sampled_from(["x", "not-a-uuid", "00000000-0000-0000-0000-000000000000", "_", "-"])
    return st.one_of(
        st.sampled_from(main),
        st.sampled_from(main).map(str.upper),
        st.uuids().map(str),
        forged,
        st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True),
    )


def commit_cases(c: Corpus) -> st.SearchStrategy[CommitCase]:
    def commit_body(events: list[dict[str, Any]], expected: int) -> dict[str, Any]:
        return {"expected_last_seq": expected, "events": events}

    valid_events = st.lists(st.sampled_from(c.envelopes).map(c.fresh_ids), min_size=1, max_size=4)
    expected = st.sampled_from([CURRENT_SEQ, CURRENT_SEQ, 0, 1, -1, 2**63])
    valid = st.builds(commit_body, valid_events, expected)
    stored = st.builds(commit_body, st.lists(st.sampled_from(c.envelopes), min_size=1, max_size=3), expected)
    ephemeral = st.builds(commit_body, st.lists(st.sampled_from(c.live), min_size=1, max_size=2), expected)
    bodies = st.one_of(
        random_body(),
        valid.map(dumps),
        stored.map(dumps),
        ephemeral.map(dumps),
        valid.flatmap(mutate),
        valid.flatmap(mutate),
        valid.flatmap(mutate),
        stored.flatmap(mutate),
    )
    return st.builds(
        CommitCase,
        st.one_of(st.just(c.loop_id), st.just(c.loop_id), _loop_tokens([c.loop_id])),
        bodies,
    )


def api_cases(c: Corpus) -> st.SearchStrategy[ApiCase]:
    verbs = st.one_of(
        st.sampled_from(VERBS),
        st.sampled_from(VERBS),
        st.sampled_from(VERBS),
        st.sampled_from(["Start", "delete", "x", "start2", "commit", "-"]),
    )

    @st.composite
    def one(draw: Draw) -> ApiCase:
        verb = draw(verbs)
        seeds = c.api_bodies.get(verb) or [b for v in VERBS for b in c.api_bodies.get(v, [])]
        seed = json.loads(json.dumps(draw(st.sampled_from(seeds))))
        if "command_id" in seed and draw(st.integers(0, 4)) > 0:
            seed["command_id"] = str(uuid.uuid4())
        body = draw(st.one_of(random_body(), st.just(dumps(seed)), st.just(dumps(seed)), mutate(seed), mutate(seed)))
        loop = draw(st.one_of(st.sampled_from(c.api_loops), st.uuids().map(str), _loop_tokens(c.api_loops)))
        return ApiCase(loop, verb, body)

    return one()


HEADER_NAMES: Final = (
    "Lw-Loop-Id",
    "Lw-Turn-Id",
    "Lw-Step-Id",
    "Lw-Tool-Use-Id",
    "Lw-Execution-Id",
    "Lw-Idempotency-Key",
    "Lw-Deadline",
    "traceparent",
)
_printable = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)


def tool_cases(c: Corpus) -> st.SearchStrategy[ToolCase]:
    @st.composite
    def one(draw: Draw) -> ToolCase:
        tool = draw(st.sampled_from(sorted(c.tool_args)))
        seed = draw(st.sampled_from(c.tool_args[tool]))
        body = draw(st.one_of(random_body(), st.just(dumps(seed)), mutate(seed), mutate(seed)))
        headers = {
            k: draw(st.one_of(st.uuids().map(str), _printable))
            for k in draw(st.lists(st.sampled_from(HEADER_NAMES), unique=True, max_size=len(HEADER_NAMES)))
        }
        # Mostly a near deadline, so a slow case ends quickly; sometimes whatever the headers say.
        deadline = draw(st.sampled_from([5_000, 5_000, 5_000, 1, -10_000, None]))
        if deadline is None and "Lw-Deadline" in headers and draw(st.booleans()):
            headers["Lw-Deadline"] = str(draw(st.sampled_from(EDGE_NUMBERS)))
        return ToolCase(tool, body, headers, deadline)

    return one()


def codec_cases(c: Corpus) -> st.SearchStrategy[CodecCase]:
    seeds = c.envelopes + c.live
    return st.builds(
        CodecCase,
        st.one_of(
            random_body(),
            st.sampled_from(seeds).map(dumps),
            st.sampled_from(seeds).flatmap(mutate),
            st.sampled_from(seeds).flatmap(mutate),
            st.sampled_from(seeds).flatmap(mutate),
        ),
    )


STRATEGIES: Final[dict[str, Callable[[Corpus], st.SearchStrategy[Any]]]] = {
    "commit": commit_cases,
    "api": api_cases,
    "tool": tool_cases,
    "codec": codec_cases,
}
