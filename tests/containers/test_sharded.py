"""A sharded deployment (LW_SHARDS=3) from compose.yaml as shipped: the same users and permissions
(deploy/nats/auth.conf) serve every shard's streams and buckets."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.containers.stack import Stack, check_histories, finish_turns, running_stack, start_turns
from tests.syshelpers import TOOL_TURN_HISTORY

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def sharded(images: dict[str, float]) -> Iterator[Stack]:
    with running_stack({"LW_SHARDS": "3"}) as s:
        yield s


def test_a_three_shard_stack_runs_loops_on_every_shard(sharded: Stack) -> None:
    loop_id = sharded.cli("start").strip().splitlines()[-1]
    assert "17*23 = 391" in sharded.cli("send", loop_id, "what is 17*23?", "--wait")
    turns = anyio.run(start_turns, sharded, 18)
    outcomes = anyio.run(finish_turns, sharded, turns, 120)
    assert [o.outcome for o in outcomes] == ["done"] * len(turns)
    loop_ids = [loop_id, *(t[0] for t in turns)]
    names = sharded.settings().names
    assert {names.shard_of(i) for i in loop_ids} == {0, 1, 2}, "every shard served a loop"
    kinds = anyio.run(check_histories, sharded, loop_ids)
    odd = {i: k for i, k in kinds.items() if k != TOOL_TURN_HISTORY}
    assert odd == {}, odd
    streams = sharded.cli("streams")
    for n in range(3):
        assert names.history_stream_of(n) in streams, streams
    assert "Violation" not in sharded.nats_logs(), "a service needed a permission it lacks"
