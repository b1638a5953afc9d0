"""The digest chain as documented (docs/protocol.md, schemas/history/): the worked example checks out
with hashlib alone, and a loop's records are judged changed, gap, broken or unchained as documented."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from shared.chain import GENESIS, START, chain_headers, stamp_of
from shared.errors import MalformedStampError
from shared.streamreads import StoredMsg
from shared.verify import LoopCheck

EXAMPLE = Path(__file__).resolve().parents[2] / "schemas" / "history" / "ChainedRecord.json"
LOOP = "6f1c2a4e-8b3d-4c5e-9f70-1a2b3c4d5e6f"


def test_the_published_example_checks_out_with_hashlib_alone() -> None:
    records = json.loads(EXAMPLE.read_text())["examples"]
    assert len(records) >= 2
    prev = "0" * 64
    for index, r in enumerate(records, 1):
        h = r["headers"]
        assert (h["Lw-Chain-Index"], h["Lw-Digest-Prev"]) == (str(index), prev)
        data = f"{index}\n{prev}\n".encode("ascii") + r["payload"].encode("utf-8")
        assert hashlib.sha256(data).hexdigest() == h["Lw-Digest"]
        prev = h["Lw-Digest"]


def _msgs(payloads: list[bytes], headers: list[dict[str, str]]) -> list[StoredMsg]:
    return [
        StoredMsg(f"lw.hist.{LOOP}", 10 * (k + 1), h, p) for k, (p, h) in enumerate(zip(payloads, headers, strict=True))
    ]


def _check(msgs: list[StoredMsg]) -> LoopCheck:
    c = LoopCheck(LOOP, "LW_HISTORY")
    for m in msgs:
        c.add(m)
    return c


PAYLOADS = [b'{"type":"LoopStarted"}', *(b'{"type":"InputSubmitted","n":%d}' % k for k in range(4))]


def test_an_intact_chain_has_no_problem() -> None:
    headers, _ = chain_headers(START, PAYLOADS)
    c = _check(_msgs(PAYLOADS, headers))
    assert c.ok and c.chained == c.records == 5 and c.fork is None


def test_each_kind_of_problem_is_found_once() -> None:
    headers, _ = chain_headers(START, PAYLOADS)
    msgs = _msgs(PAYLOADS, headers)
    msgs[1].data = b'{"type":"InputSubmitted","n":99}'  # changed
    del msgs[3]  # gap: the fourth record is gone
    c = _check(msgs)
    assert [(p.kind, p.seq) for p in c.problems] == [("changed", 20), ("gap", 50)]
    headers[2]["Lw-Digest-Prev"] = GENESIS  # broken: chained to another digest
    c = _check(_msgs(PAYLOADS, headers))
    assert [(p.kind, p.seq) for p in c.problems] == [("changed", 30), ("broken", 30)]


def test_old_records_are_unchained_and_the_chain_may_start_after_them() -> None:
    headers, _ = chain_headers(START, PAYLOADS[2:])
    c = _check(_msgs(PAYLOADS, [{}, {}, *headers]))
    assert c.ok and (c.unchained, c.chained, c.unchained_last_seq) == (2, 3, 20)
    late = _check(_msgs(PAYLOADS, [*chain_headers(START, PAYLOADS[:2])[0], {}, {}, {}]))
    assert [p.kind for p in late.problems] == ["broken"] * 3  # no digest after the chain began


def test_a_chain_that_starts_elsewhere_is_broken_unless_it_is_a_fork() -> None:
    headers, _ = chain_headers(chain_headers(START, PAYLOADS[:2])[1], PAYLOADS[2:])
    assert [p.kind for p in _check(_msgs(PAYLOADS[2:], headers)).problems] == ["broken"]
    fork = b'{"type":"LoopForked","source_loop_id":"x","source_seq":7}'
    headers, _ = chain_headers(chain_headers(START, PAYLOADS[:2])[1], [fork])
    c = _check(_msgs([fork], headers))
    assert c.ok and c.fork is not None and (c.fork.source_seq, c.fork.stamp.index) == (7, 3)


@pytest.mark.parametrize(
    "headers",
    [
        {"Lw-Digest": "0" * 64},
        {"Lw-Chain-Index": "0", "Lw-Digest-Prev": "0" * 64, "Lw-Digest": "0" * 64},
        {"Lw-Chain-Index": "1", "Lw-Digest-Prev": "0" * 63, "Lw-Digest": "0" * 64},
        {"Lw-Chain-Index": "1", "Lw-Digest-Prev": "0" * 64, "Lw-Digest": "A" * 64},
    ],
)
def test_malformed_chain_headers_are_an_error(headers: dict[str, str]) -> None:
    with pytest.raises(MalformedStampError):
        stamp_of(headers)
    assert [p.kind for p in _check(_msgs([b"{}"], [headers])).problems] == ["changed"]
