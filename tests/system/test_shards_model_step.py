"""Model-step and tool workers with ``LW_SHARDS=3`` on one nats-server, as separate OS processes.

Every check reads what is stored: each shard's history stream, leases bucket and results bucket.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.client import LoopClient
from shared.codec import decode_event
from shared.settings import Settings
from shared.streamreads import get_msg, subjects
from shared.subjects import Names, kv_stream
from tests.syshelpers import check_history_invariants, history, system, types, wait_history, write_script

pytestmark = [pytest.mark.anyio, pytest.mark.system]

SHARDS = 3
LEDGER = "tests.system.ledger_tool:ledger_idem"  # idempotent, not read-only: its steps record plans and results


@pytest.fixture
def sharded(settings: Settings) -> Settings:
    return dataclasses.replace(settings, shards=SHARDS)


def _loop_ids(names: Names, per_shard: int) -> list[str]:
    """New loop ids, ``per_shard`` in each shard."""
    by_shard: dict[int, list[str]] = {k: [] for k in names.shard_ids}
    while any(len(ids) < per_shard for ids in by_shard.values()):
        loop_id = str(uuid.uuid4())
        ids = by_shard[names.shard_of(loop_id)]
        if len(ids) < per_shard:
            ids.append(loop_id)
    return [loop_id for ids in by_shard.values() for loop_id in ids]


def _ledger_steps(tmp: Path, steps: int, *, first_sleep: float = 0.0) -> str:
    """A script of ``steps`` steps that each call the ledger tool once, then a final answer."""
    script = [
        [
            {"sleep": first_sleep if k == 0 else 0.0},
            {"kind": "tool_use", "index": 0, "id": f"call_{k}_{{k}}", "name": "ledger_idem"},
            {"kind": "tool_use", "index": 0, "text": json.dumps({"note": str(k), "hold": 0.01})},
            {"kind": "finish", "finish_reason": "tool_use"},
        ]
        for k in range(steps)
    ]
    script.append([{"kind": "text", "text": "finished"}])
    return write_script(tmp, script)


async def _start(nc: NATS, names: Names, loop_ids: list[str], model: str) -> None:
    lc = LoopClient(nc, names)
    for loop_id in loop_ids:
        await lc.start(loop_id, model=model)
        await lc.input(loop_id, "count")


async def _all_idle(nc: NATS, settings: Settings, loop_ids: list[str], timeout: float) -> None:
    with anyio.fail_after(timeout):
        for loop_id in loop_ids:
            await wait_history(nc, settings, loop_id, lambda h: h.idle, timeout=timeout)


async def _stored_loops(nc: NATS, names: Names, shard: int) -> dict[str, int]:
    """Loop id → records, of the loops in ``shard``'s history stream."""
    found = await subjects(nc, names.history_stream_of(shard), names.hist_all_of(shard))
    return {names.loop_of_hist(subject): count for subject, count in found.items()}


async def test_loops_of_every_shard_run_to_the_end_with_their_records_in_their_own_shard(
    sharded: Settings, nc: NATS, tmp_path: Path
) -> None:
    names = sharded.names
    steps = 3
    loop_ids = _loop_ids(names, 10)
    ledger = tmp_path / "ledger.jsonl"
    with system(sharded, model_steps=2, tools=(LEDGER,), env={"LW_LEDGER": str(ledger)}):
        await _start(nc, names, loop_ids, _ledger_steps(tmp_path, steps))
        await _all_idle(nc, sharded, loop_ids, 90)

    expected = ["LoopStarted", "InputSubmitted", "TurnStarted", *["StepDone"] * (steps + 1), "TurnDone", "LoopIdle"]
    for k in names.shard_ids:
        stored = await _stored_loops(nc, names, k)
        mine = {loop_id for loop_id in loop_ids if names.shard_of(loop_id) == k}
        assert set(stored) == mine, f"shard {k} holds other loops than its own"
        for loop_id in mine:
            assert stored[loop_id] == len(expected)
            tip = await get_msg(nc, names.history_stream_of(k), last_by_subj=names.hist_in(k, loop_id))
            assert tip is not None and isinstance(decode_event(tip.data), ev.LoopIdle)
    for loop_id in loop_ids:
        events = await history(nc, sharded, loop_id)
        check_history_invariants(events)
        assert types(events) == expected
    # Each loop's step plans and call records are in its own shard's results bucket.
    calls = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert {c["loop_id"] for c in calls} == set(loop_ids)
    for k in names.shard_ids:
        bucket = names.results_bucket_of(k)
        keys = {s.removeprefix(f"$KV.{bucket}.") for s in await subjects(nc, kv_stream(bucket), f"$KV.{bucket}.>")}
        mine = [c for c in calls if names.shard_of(c["loop_id"]) == k]
        assert {f"tool.ledger_idem.{c['execution_id']}" for c in mine} <= keys
        assert {f"step.{c['step_id']}" for c in mine} <= keys
        others = {f"tool.ledger_idem.{c['execution_id']}" for c in calls} - {
            f"tool.ledger_idem.{c['execution_id']}" for c in mine
        }
        assert not others & keys, f"shard {k}'s results bucket holds calls of other shards' loops"


async def test_a_replica_serving_shard_0_drives_only_its_loops(sharded: Settings, nc: NATS, tmp_path: Path) -> None:
    names = sharded.names
    loop_ids = _loop_ids(names, 2)
    home = [loop_id for loop_id in loop_ids if names.shard_of(loop_id) == 0]
    others = [loop_id for loop_id in loop_ids if names.shard_of(loop_id) != 0]
    ledger = tmp_path / "ledger.jsonl"
    with system(sharded, model_steps=0, tools=(LEDGER,), env={"LW_LEDGER": str(ledger)}) as sysm:
        sysm.model_step(LW_SHARDS_SERVED="0")
        await _start(nc, names, loop_ids, _ledger_steps(tmp_path, 1))
        await _all_idle(nc, sharded, home, 30)
        await anyio.sleep(1.0)
        for loop_id in others:  # nobody drives them: not even their turn started
            assert types(await history(nc, sharded, loop_id)) == ["LoopStarted", "InputSubmitted"]
        sysm.model_step()  # a replica of every shard
        await _all_idle(nc, sharded, others, 30)


async def test_a_killed_replica_s_loops_of_every_shard_resume_on_another(
    sharded: Settings, nc: NATS, tmp_path: Path
) -> None:
    names = sharded.names
    loop_ids = _loop_ids(names, 2)
    ledger = tmp_path / "ledger.jsonl"
    # Long leases: the replica started after the kill finds them still held by the dead one (orphaned).
    env = {"LW_LEDGER": str(ledger), "LW_LEASE_TTL_SECONDS": "30"}
    with system(sharded, model_steps=1, tools=(LEDGER,), env=env) as sysm:
        await _start(nc, names, loop_ids, _ledger_steps(tmp_path, 1, first_sleep=4.0))
        for loop_id in loop_ids:  # each asks the model, which takes a while: its lease is held
            await wait_history(nc, sharded, loop_id, lambda h: h.open_turn is not None, timeout=15)
        for loop_id in loop_ids:
            kv = await nc.jetstream().key_value(names.leases_bucket_of(names.shard_of(loop_id)))
            assert (await kv.get(loop_id)).value
        [victim] = sysm.sup.by_name("model-step")
        victim.kill()
        successor = sysm.model_step()
        await _all_idle(nc, sharded, loop_ids, 40)
        log = await anyio.Path(successor.log_path).read_text()
        assert f"start-up: {len(loop_ids)} loop(s) of a replica that is gone signalled" in log, log[-3000:]
