"""CI fuzzing: a small deterministic (derandomized) hypothesis set per boundary against real processes.

Every case must end as accepted or as a structured rejection: no crash, no hang, no unstructured
reply, and the history stream unchanged by anything rejected. The long campaign is
``python -m tests.fuzz.run --cases 10000`` (docs/reliability.md).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz import gen
from tests.fuzz.env import FuzzEnv, fuzz_env, run_boundary
from tests.fuzz.gen import CURRENT_SEQ, ApiCase, CommitCase

pytestmark = pytest.mark.system

CI_CASES = {"commit": 300, "api": 300, "tool": 200, "codec": 600}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzEnv]:
    with fuzz_env(tmp_path_factory.mktemp("fuzz")) as e:
        yield e


def test_the_corpus_covers_every_stored_event_shape(env: FuzzEnv) -> None:
    types = {e["type"] for e in env.corpus.envelopes}
    expected = {
        "LoopStarted",
        "InputSubmitted",
        "TurnStarted",
        "StepDone",
        "PermissionDecided",
        "GateOpened",
        "PermissionRequested",
        "GateResolved",
        "TurnDone",
        "TurnFailed",
        "LoopIdle",
        "LoopClosed",
    }
    assert expected <= types, expected - types
    assert {"TokenDelta", "ToolCallStarted", "ToolCallCompleted"} <= {e["type"] for e in env.corpus.live}


@pytest.mark.parametrize("boundary", list(CI_CASES))
def test_fuzz_boundary(env: FuzzEnv, boundary: str, tmp_path: Path) -> None:
    stats = run_boundary(env, boundary, CI_CASES[boundary], derandomize=True)
    print(f"{boundary}: {stats.as_dict()}")
    assert stats.cases >= CI_CASES[boundary] // 2, "hypothesis generated too few cases"
    assert stats.failures == 0, "\n".join(stats.examples)
    # the set is not trivial: it reaches the validation behind the JSON checks, and some input is valid
    assert sum(stats.rejected.values()) > 0
    if boundary in ("commit", "api", "tool"):
        assert stats.accepted > 0


def _event(env: FuzzEnv, type_name: str) -> dict[str, Any]:
    return copy.deepcopy(next(e for e in env.corpus.envelopes if e["type"] == type_name))


def _commit(events: list[dict[str, Any]], seq: object = CURRENT_SEQ) -> bytes:
    return json.dumps({"expected_last_seq": seq, "events": events}).encode()


BadCase = tuple[str, Any, str]  # (what, the case, the error kind it must get)


def test_every_category_of_bad_input_gets_its_structured_error(env: FuzzEnv) -> None:
    """One case per category the issue names, with the error each must get (and nothing stored)."""
    loop = env.corpus.loop_id
    # The loop-API cases go to a loop of their own, started now: the fuzzing before may have closed
    # the corpus loop (a close is valid input), and a closed loop refuses before it reads a body.
    open_loop = str(uuid.uuid4())
    started = env.execute("api", ApiCase(open_loop, "start", json.dumps({"command_id": str(uuid.uuid4())}).encode()))
    assert started.outcome == "accepted", started
    cases: list[BadCase] = [
        *_size_and_depth_cases(env, loop, open_loop),
        *_type_and_field_cases(env, loop, open_loop),
        *_encoding_cases(env, loop, open_loop),
        *_identity_and_routing_cases(env, loop, open_loop),
    ]
    for what, case, kind in cases:
        boundary = "commit" if isinstance(case, CommitCase) else "api"
        r = env.execute(boundary, case)
        assert (r.outcome, r.detail) == ("rejected", kind), what


def _size_and_depth_cases(env: FuzzEnv, loop: str, open_loop: str) -> list[BadCase]:
    step = copy.deepcopy(next(e for e in env.corpus.envelopes if e["type"] == "StepDone" and len(e["messages"]) == 1))
    # a record over the committer's limit (max_payload - 1 KiB) whose request still fits one NATS message
    huge = copy.deepcopy(step)
    huge["messages"][0]["blocks"] = [{"type": "text", "text": ""}]
    huge["messages"][0]["blocks"][0]["text"] = "x" * (1_048_100 - len(json.dumps(huge)))
    deep = copy.deepcopy(step)
    deep["messages"][0]["blocks"] = [{"type": "text", "text": "x", "extra": gen.nest(1, 300, False)}]
    # an input whose body fits one NATS message but whose record (ids, timestamps added) does not fit 1 MiB
    api_huge = json.dumps({"command_id": str(uuid.uuid4()), "text": ""}).encode()
    api_huge = api_huge.replace(b'""', b'"' + b"y" * (1_048_450 - len(api_huge)) + b'"')
    return [
        ("oversized event", CommitCase(loop, _commit([huge])), "too_large"),
        ("deep nesting", CommitCase(loop, _commit([deep])), "invalid"),
        ("huge loop-API string", ApiCase(open_loop, "input", api_huge), "too_large"),
    ]


def _type_and_field_cases(env: FuzzEnv, loop: str, open_loop: str) -> list[BadCase]:
    typed = _event(env, "LoopIdle")
    typed["created_at"] = 12
    unknown = _event(env, "LoopIdle")
    unknown["colour"] = "blue"
    return [
        ("wrong type (request)", CommitCase(loop, _commit([_event(env, "LoopIdle")], seq="1")), "invalid"),
        ("sequence out of range", CommitCase(loop, _commit([_event(env, "LoopIdle")], seq=2**64)), "invalid"),
        ("wrong type (event)", CommitCase(loop, _commit([typed])), "invalid"),
        ("unknown field (event)", CommitCase(loop, _commit([unknown])), "invalid"),
        (
            "unknown field (request)",
            ApiCase(open_loop, "close", b'{"command_id": "%s", "force": true}' % str(uuid.uuid4()).encode()),
            "invalid",
        ),
    ]


def _encoding_cases(env: FuzzEnv, loop: str, open_loop: str) -> list[BadCase]:
    return [
        (
            "duplicate keys",
            CommitCase(loop, b'{"expected_last_seq": 1, "Expected_Last_Seq": 2, "events": []}'),
            "invalid",
        ),
        (
            "duplicate keys in an event",
            CommitCase(
                loop,
                _commit([_event(env, "LoopIdle")]).replace(
                    b'"type": "LoopIdle"', b'"type": "LoopIdle", "TYPE": "LoopIdle"'
                ),
            ),
            "invalid",
        ),
        (
            "invalid UTF-8",
            CommitCase(loop, _commit([_event(env, "LoopIdle")]).replace(b'"v": 1', b'"v\xff": 1')),
            "invalid",
        ),
        (
            "huge type name",
            CommitCase(loop, _commit([{**_event(env, "LoopIdle"), "type": "T" * 1_040_000}])),
            "invalid",
        ),
        (
            "huge unknown key",
            ApiCase(
                open_loop, "close", b'{"command_id": "%s", "%s": 1}' % (str(uuid.uuid4()).encode(), b"k" * 1_040_000)
            ),
            "invalid",
        ),
    ]


def _identity_and_routing_cases(env: FuzzEnv, loop: str, open_loop: str) -> list[BadCase]:
    token = next(e for e in env.corpus.live if e["type"] == "TokenDelta")
    forged = _event(env, "TurnDone")
    forged["loop_id"] = str(uuid.uuid4())
    answer = {"command_id": str(uuid.uuid4()), "gate_id": str(uuid.uuid4()), "action": "approve"}
    return [
        ("ephemeral event", CommitCase(loop, _commit([{**token, "loop_id": loop}])), "invalid"),
        ("forged loop id (event)", CommitCase(loop, _commit([forged])), "invalid"),
        ("forged loop id (subject)", CommitCase(loop.upper(), _commit([_event(env, "LoopIdle")])), "invalid"),
        ("forged gate id", ApiCase(open_loop, "answer", json.dumps(answer).encode()), "not_found"),
        ("unknown verb", ApiCase(open_loop, "delete", b'{"command_id": "%s"}' % str(uuid.uuid4()).encode()), "invalid"),
        ("not JSON", ApiCase(open_loop, "start", b"\x00\x01 not json"), "invalid"),
    ]
