"""System-test helpers: every service as its own OS process, driven only through NATS.

``System`` starts committers, model-step replicas and tool workers (a ``services.deployment``
:class:`Deployment`) against a given NATS URL and prefix; results are read back only from the
replayed history.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.deployment import Deployment, service_command, tool_command
from shared import events as ev
from shared.codec import decode_live_frame
from shared.events import Event
from shared.history import LoopHistory
from shared.procs import ServiceProcess, Supervisor
from shared.replay import load, replay
from shared.settings import Settings
from shared.subjects import Names
from shared.validate import validate_event
from shared.verify import verify_all

T = TypeVar("T")


def debian_program(name: str, package: str) -> str:
    """The path of a program from Debian that a test module needs. Where it is missing the module is
    skipped with the reason and the command that installs it; under CI (``CI=true``, as ``.ci/run``
    runs, which installs it) a missing program fails instead: no test is skipped there in silence."""
    path = shutil.which(name)
    if path:
        return path
    why = f"{name} is not installed: apt-get install {package}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{why} (.ci/run installs it)", pytrace=False)
    pytest.skip(why, allow_module_level=True)


# The committed history of a loop whose one turn is a tool step followed by the final answer.
TOOL_TURN_HISTORY: Final = [
    "LoopStarted",
    "InputSubmitted",
    "TurnStarted",
    "StepDone",
    "StepDone",
    "TurnDone",
    "LoopIdle",
]


@dataclass
class System:
    """Service processes of one test (a :class:`Deployment`) against the test's NATS and prefix."""

    settings: Settings
    deployment: Deployment

    @property
    def log_dir(self) -> Path:
        return self.deployment.log_dir

    @property
    def env(self) -> dict[str, str]:
        return self.deployment.env

    @property
    def sup(self) -> Supervisor:
        return self.deployment.sup

    def start(self, name: str, args: list[str], *, env: dict[str, str] | None = None) -> ServiceProcess:
        return self.deployment.start(name, args, env)

    def committer(self) -> ServiceProcess:
        return self.start("committer", service_command("committer"))

    def model_step(self, **env: str) -> ServiceProcess:
        return self.start("model-step", service_command("model-step"), env=env)

    def tools(self, *names: str, **env: str) -> ServiceProcess:
        return self.start("tools-" + "-".join(names), tool_command(*names), env=env)

    def replace(self, svc: ServiceProcess) -> ServiceProcess:
        """Start a fresh process of the same service (after a kill)."""
        return self.deployment.replace(svc)

    def logs(self) -> str:
        return self.deployment.log_tails()


@contextmanager
def system(
    settings: Settings,
    *,
    committers: int = 1,
    model_steps: int = 1,
    tools: Sequence[str] = ("calculator", "clock"),
    env: dict[str, str] | None = None,
) -> Iterator[System]:
    with tempfile.TemporaryDirectory(prefix="lw-sys-") as d:
        s = System(settings, Deployment.for_settings(settings, Path(d), env=env))
        d = s.deployment
        procs = [d.process("committer", service_command("committer")) for _ in range(committers)]
        if tools:
            procs.append(d.process("tools-" + "-".join(tools), tool_command(*tools)))
        procs += [d.process("model-step", service_command("model-step")) for _ in range(model_steps)]
        with d.stopped_on_exit():
            # All at once, as ``loopwire up`` starts them: the others wait for the deployment the
            # committer creates.
            d.start_all(procs)
            yield s


def write_script(tmp: Path, responses: Any, name: str = "script.json") -> str:
    path = tmp / name
    path.write_text(json.dumps(responses))
    return f"scripted:{path}"


async def wait_for(probe: Callable[[], Awaitable[T | None]], *, timeout: float, interval: float = 0.05) -> T:
    """Poll ``probe`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await anyio.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout}s (last: {last!r})")


async def collect_live(nc: NATS, settings: Settings, loop_id: str) -> list[Event]:
    """A list that fills with the loop's live events from now on."""
    got: list[Event] = []

    async def cb(m: Msg) -> None:
        got.extend(decode_live_frame(m.data))

    await nc.subscribe(settings.names.live(loop_id), cb=cb)
    return got


async def history(nc: NATS, settings: Settings, loop_id: str) -> list[tuple[int, Event]]:
    return [pair async for pair in replay(nc, loop_id, names=settings.names)]


async def wait_history(
    nc: NATS, settings: Settings, loop_id: str, pred: Callable[[LoopHistory], bool], *, timeout: float = 20.0
) -> LoopHistory:
    cache: dict[str, LoopHistory] = {}

    async def probe() -> LoopHistory | None:
        h = await load(nc, settings.names, loop_id, cache.get("h"))
        cache["h"] = h
        return h if pred(h) else None

    return await wait_for(probe, timeout=timeout)


def types(events: Sequence[tuple[int, Event]], *, skip: tuple[type[Event], ...] = ()) -> list[str]:
    return [type(e).__name__ for _, e in events if not isinstance(e, skip)]


def check_history_invariants(events: Sequence[tuple[int, Event]]) -> None:
    """Every event validates, event ids are unique, no step is committed twice, seqs increase."""
    seen_ids: set[str] = set()
    steps: set[str] = set()
    last = 0
    for seq, e in events:
        validate_event(e)
        assert seq > last, f"sequence went backwards at {seq}"
        last = seq
        assert e.event_id not in seen_ids, f"duplicate event_id {e.event_id}"
        seen_ids.add(e.event_id)
        if isinstance(e, ev.StepDone):
            assert e.step_id not in steps, f"step {e.step_id} committed twice"
            steps.add(e.step_id)


async def check_every_record_chained(nc: NATS, settings: Settings, *, loops: int) -> None:
    """``verify --all``'s check: ``loops`` loops, each record digested and following the one before it."""
    report = await verify_all(nc, settings.names)
    assert report.ok, [p.line() for p in report.problems]
    assert len(report.loops) == loops
    assert all(c.records and c.chained == c.records for c in report.loops.values()), report.summary()


def loop_ids_per_shard(names: Names, per_shard: int) -> dict[int, list[str]]:
    """``per_shard`` new loop ids for each shard of ``names`` (random ids, kept by the shard they fall in)."""
    out: dict[int, list[str]] = {k: [] for k in names.shard_ids}
    while any(len(v) < per_shard for v in out.values()):
        loop_id = str(uuid.uuid4())
        if len(out[names.shard_of(loop_id)]) < per_shard:
            out[names.shard_of(loop_id)].append(loop_id)
    return out
