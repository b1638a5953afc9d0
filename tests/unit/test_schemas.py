"""The published contract (schemas/, docs/asyncapi.yaml) is generated from the code and must not drift."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from services.cli import main
from services.contract.asyncapi import asyncapi_document
from services.contract.catalog import JSON_SCHEMA_DIALECT
from services.contract.files import asyncapi_drift, schema_drift, write_schemas
from services.contract.schemas import render_schemas, schema_files
from services.contract.yaml_emitter import to_yaml
from shared import protocol, subjects
from shared.codec import encode_live
from shared.errors import ErrorKind
from shared.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
ASYNCAPI = ROOT / "docs" / "asyncapi.yaml"
REGENERATE = "regenerate with: loopwire schema --out schemas --asyncapi docs/asyncapi.yaml"


def test_checked_in_schemas_match_the_code() -> None:
    assert schema_drift(SCHEMAS) == [], REGENERATE


def test_checked_in_asyncapi_matches_the_code() -> None:
    assert asyncapi_drift(ASYNCAPI) == [], REGENERATE


def test_drift_is_detected(tmp_path: Path) -> None:
    write_schemas(tmp_path)
    assert schema_drift(tmp_path) == []
    path = tmp_path / "events" / "StepDone.json"
    doc = json.loads(path.read_text())
    del doc["$defs"]["StepDone"]["properties"]["messages"]  # as if the code had changed
    path.write_text(json.dumps(doc))
    (tmp_path / "events" / "Gone.json").write_text("{}")
    (tmp_path / "conformance" / "valid").mkdir(parents=True)
    (tmp_path / "conformance" / "valid" / "Case.json").write_text("{}")  # hand-written corpus: not drift
    problems = schema_drift(tmp_path)
    assert not any("conformance" in p for p in problems)
    assert any("differs" in p and "StepDone.json" in p for p in problems)
    assert any("stale" in p and "Gone.json" in p for p in problems)


def test_schema_command_check_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, api = tmp_path / "s", tmp_path / "asyncapi.yaml"
    assert main(["schema", "--out", str(out), "--asyncapi", str(api)]) == 0
    assert main(["schema", "--out", str(out), "--asyncapi", str(api), "--check"]) == 0
    api.write_text(api.read_text() + "# edited\n")
    assert main(["schema", "--asyncapi", str(api), "--check"]) == 1
    assert "differs" in capsys.readouterr().err
    assert main(["schema"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert set(every) == set(schema_files())


def test_every_wire_type_has_a_schema() -> None:
    files = schema_files()
    for name in EVENT_TYPES:
        assert f"events/{name}.json" in files
    for verb, cls in protocol.REQUEST_TYPES.items():
        assert f"api/{cls.__name__}.json" in files, verb
    for path in ("commit/CommitRequest.json", "commit/CommitReply.json", "api/ApiReply.json"):
        assert path in files
    for path, doc in files.items():
        assert doc["$schema"] == JSON_SCHEMA_DIALECT
        _assert_refs_resolve(doc, doc, path)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _assert_refs_resolve(node: Any, doc: dict[str, Any], where: str) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                _resolve(doc, v)
            else:
                _assert_refs_resolve(v, doc, where)
    elif isinstance(node, list):
        for v in node:
            _assert_refs_resolve(v, doc, where)


def test_event_schemas_describe_the_encoded_events() -> None:
    # Every property of an encoded sample is declared, and the type tag is the event's name.
    files = schema_files()
    for name, cls in EVENT_TYPES.items():
        doc = files[f"events/{name}.json"]
        body = doc["$defs"][name]
        sample = json.loads(encode_live(cls(loop_id="00000000-0000-4000-8000-000000000000")))
        assert set(sample) <= set(body["properties"]), name
        assert body["properties"]["type"]["enum"] == [name]
        assert body["additionalProperties"] is False


def test_commit_request_events_are_documented_as_envelopes() -> None:
    doc = schema_files()["commit/CommitRequest.json"]
    items = doc["$defs"]["CommitRequest"]["properties"]["events"]["items"]
    refs = {r["$ref"].rsplit("/", 1)[1] for r in items["anyOf"]}
    assert "StepDone" in refs and "TokenDelta" not in refs


def test_asyncapi_yaml_reads_back_and_every_ref_resolves() -> None:
    doc = yaml.safe_load(ASYNCAPI.read_text())
    assert doc == json.loads(json.dumps(asyncapi_document()))
    assert doc["asyncapi"].startswith("3.")
    _assert_refs_resolve(doc, doc, "asyncapi")
    for name in EVENT_TYPES:
        assert name in doc["components"]["messages"] and name in doc["components"]["schemas"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", k) for k in doc["components"]["schemas"])
    # Operations name messages of their own channel.
    for op_name, op in doc["operations"].items():
        channel = op["channel"]["$ref"]
        for m in op["messages"]:
            assert m["$ref"].startswith(channel + "/messages/"), op_name


def test_asyncapi_lists_every_subject_header_and_error() -> None:
    text = ASYNCAPI.read_text()
    n = subjects.Names("{prefix}")
    for address in (
        n.hist("{loop_id}"),
        n.live("{loop_id}"),
        n.commit("{loop_id}"),
        n.work("{loop_id}"),
        n.tool("{tool_name}"),
        n.toolctl("{execution_id}"),
        *(n.api("{loop_id}", verb) for verb in subjects.VERBS),
    ):
        assert f'address: "{address}"' in text, address
    header_names = [v for k, v in vars(subjects).items() if k.startswith("H_")]
    missing = {h for h in header_names if h not in text}
    # Read-side JetStream headers (Nats-Sequence, Status, ...) are not part of loopwire's contract.
    assert missing <= {
        subjects.H_SEQUENCE,
        subjects.H_SUBJECT,
        subjects.H_NUM_PENDING,
        subjects.H_LAST_SEQUENCE,
        subjects.H_TIMESTAMP,
        subjects.H_STATUS,
    }
    for kind in ErrorKind:
        assert f'"{kind.value}"' in text


def test_yaml_emitter_round_trips_awkward_values() -> None:
    value = {
        "yes": "no",
        "$ref": "#/a",
        "key with space": ["", "multi\nline", 'quote"s', "ünï", "- dash", "# hash", ":colon", "null"],
        "nested": {"empty_d": {}, "empty_l": [], "n": None, "t": True, "i": 3, "f": 1.5},
        "list": [{"a": 1, "b": [1, {"c": []}]}, [1, 2], []],
    }
    assert yaml.safe_load(to_yaml(value, "header\nline")) == value


def test_schema_files_are_valid_json_schema_shapes() -> None:
    # Every top-level schema validates through msgspec's own encoder (a sanity check of the output).
    for text in render_schemas().values():
        assert isinstance(msgspec.json.decode(text), dict)


VOCABULARIES = (
    "TurnFailedKind",
    "GateKind",
    "GateAction",
    "AnswerAction",
    "PolicyEffect",
    "PermissionEffect",
    "PermissionReason",
    "DecisionEffect",
    "ChunkKind",
    "ToolErrorKind",
    "Uuid",
    "Rfc3339",
)


def test_asyncapi_references_the_payload_schemas_definitions() -> None:
    # One definition each: the AsyncAPI components are the schema files' own definitions, referenced by
    # the payloads, never a second copy of an enum.
    components = asyncapi_document()["components"]["schemas"]
    text = json.dumps(components)
    files = schema_files()
    for name in VOCABULARIES:
        assert f'"#/components/schemas/{name}"' in text, name
        in_files = [doc["$defs"][name] for doc in files.values() if name in doc.get("$defs", {})]
        assert in_files and all(d == components[name] for d in in_files), name
    assert "discriminator" not in text


def test_named_string_constants_are_the_wire_vocabularies() -> None:
    # Constants other modules spell out are members of the one vocabulary definition.
    from services.model_step import policy
    from services.toolcaller import client
    from services.toolwire import protocol as tools
    from shared import wiretypes

    assert {
        tools.ERROR_TIMEOUT,
        tools.ERROR_CANCELED,
        tools.ERROR_INTERNAL,
        tools.ERROR_NOT_STARTED,
        tools.ERROR_REFUSED,
        tools.ERROR_UNAVAILABLE,
        tools.ERROR_CRASHED,
    } == set(wiretypes.TOOL_ERROR_KINDS)

    assert (
        policy.GATE_OUTCOME_UNKNOWN in wiretypes.GATE_REASONS and policy.ON_UNKNOWN_ASK in wiretypes.ON_UNKNOWN_OUTCOMES
    )
    assert {client.CRASHED, client.UNAVAILABLE, client.TIMEOUT} == set(wiretypes.RETRYABLE_OUTCOMES)
    assert {policy.ALLOW, policy.DENY, policy.ASK} == set(wiretypes.POLICY_EFFECTS)
    assert set(wiretypes.ANSWER_ACTIONS) == set(wiretypes.GATE_ACTIONS) - {"abandoned"}


def _names_subjects() -> list[tuple[str, str]]:
    """Every subject and bucket ``shared.subjects.Names`` builds, by member name: a string parameter as a
    ``{placeholder}``, a vocabulary (the verb) as each of its values, a shard as 0. Names is the one place
    loopwire spells them, so a new one cannot be missed."""
    import inspect
    import itertools
    import typing

    n = subjects.Names("{prefix}")
    out: list[tuple[str, str]] = []
    for name, member in inspect.getmembers(subjects.Names):
        if name.startswith("_") or name in ("prefix", "shards", "shard_ids"):
            continue
        if isinstance(member, property):
            out.append((name, getattr(n, name)))
            continue
        if not inspect.isfunction(member) or isinstance(inspect.getattr_static(subjects.Names, name), staticmethod):
            continue  # loop_of_hist, loop_of_work: they read a subject, they build none
        hints = typing.get_type_hints(member)
        choices: list[list[object]] = []
        for p in list(inspect.signature(member).parameters.values())[1:]:
            hint = hints[p.name]
            if typing.get_origin(hint) is typing.Literal:
                choices.append(list(typing.get_args(hint)))
            else:
                choices.append([0 if hint is int else f"{{{p.name}}}"])
        out += [(name, member(n, *args)) for args in itertools.product(*choices)]
    return [(k, v) for k, v in out if isinstance(v, str)]


def _tokens_match(pattern: str, address: str) -> bool:
    """Whether NATS subject ``pattern`` (``*``, ``>``) covers ``address``; a ``{param}`` is any one token."""
    want, have = pattern.split("."), address.split(".")
    for i, w in enumerate(want):
        if w == ">":
            return len(have) > i
        if i >= len(have):
            return False
        if w != "*" and w != have[i] and not (have[i].startswith("{") and w.startswith("{")):
            return False
    return len(want) == len(have)


def test_every_subject_and_bucket_loopwire_uses_is_a_channel() -> None:
    # Every subject a service publishes or subscribes to comes from shared.subjects.Names: each must be a
    # channel's address (a wildcard one must cover one), and each KV bucket must have its keys' channel.
    doc = yaml.safe_load(ASYNCAPI.read_text())
    addresses = [c["address"] for c in doc["channels"].values() if c.get("address")]
    found = _names_subjects()
    assert {"ctl", "hist", "live", "commit", "api", "work", "tool", "toolctl", "tools_bucket"} <= {k for k, _ in found}
    missing = []
    for member, value in found:
        if value.startswith("{prefix}."):
            if not any(_tokens_match(value, a) for a in addresses):
                missing.append(f"{member}: {value}")
        elif "_bucket" in member and not any(a.startswith(f"$KV.{value}.") for a in addresses):
            missing.append(f"{member}: $KV.{value}.>")
    assert missing == [], "subjects with no channel in docs/asyncapi.yaml"


def test_the_subject_matcher_tells_channels_apart() -> None:
    assert _tokens_match("{prefix}.ctl.{loop_id}", "{prefix}.ctl.{loop_id}")
    assert _tokens_match("{prefix}.api.*.*", "{prefix}.api.{loop_id}.start")
    assert _tokens_match("{prefix}.hist.>", "{prefix}.hist.{loop_id}")
    assert not _tokens_match("{prefix}.ctl.{loop_id}", "{prefix}.live.{loop_id}")
    assert not _tokens_match("{prefix}.api.*.*", "{prefix}.api.{loop_id}")
