"""The fault suite's load: N concurrent loops × 10 steps driven only through the loop API.

A test operator answers the permission gates the script (:mod:`tests.system.faultscript`) opens;
each loop is followed from its history while a fault coroutine kills, stops or restarts things.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import events as ev
from shared import shaping
from shared.client import ApiResult, LoopClient
from shared.codec import decode_live_frame
from shared.errors import LoopwireError
from shared.events import Event
from shared.history import LoopHistory
from shared.jserrors import JetStreamError, JetStreamUnavailableError
from shared.protocol import RemoteError, UnavailableError
from shared.replay import load
from shared.settings import Settings
from tests.system.faultscript import FAULT_RESULT_PREFIXES, GATED_TOOL, STEPS


@dataclass
class LoopState:
    loop_id: str
    acked: dict[str, str] = field(default_factory=dict)  # command_id → verb, acknowledged
    unacked: dict[str, str] = field(default_factory=dict)  # command_id → verb, never acknowledged
    answered: set[str] = field(default_factory=set)  # gate ids answered (acknowledged)
    h: LoopHistory | None = None
    wake: anyio.Event = field(default_factory=anyio.Event)
    advances: list[float] = field(default_factory=list)  # when its history was seen to grow
    done_at: float = 0.0
    closed: bool = False

    @property
    def max_stall(self) -> float:
        """Longest time this loop's history did not grow (normal waits included: tools, the operator)."""
        return max((b - a for a, b in itertools.pairwise(self.advances)), default=0.0)


def finished(h: LoopHistory) -> bool:
    return h.turns >= 1 and h.open_turn is None and not h.pending_inputs and h.idle


@dataclass
class LiveToolCalls:
    """ToolCallStarted / ToolCallCompleted seen on the live subjects (for timing faults mid-call)."""

    running: dict[str, tuple[str, float]] = field(default_factory=dict)  # execution id → (tool, started)
    completed_errors: Counter[str] = field(default_factory=Counter)  # result prefix → count
    retries: int = 0  # attempts of read-only / idempotent tools that got no answer and were sent again

    def on_event(self, e: Event) -> None:
        if isinstance(e, ev.ToolCallStarted):
            self.running[e.tool_execution_id] = (e.tool_name, time.monotonic())
        elif isinstance(e, ev.ToolCallProgress):
            if shaping.RETRYING in e.message:
                self.retries += 1
        elif isinstance(e, ev.ToolCallCompleted):
            self.running.pop(e.tool_execution_id, None)
            if e.is_error:
                for p in FAULT_RESULT_PREFIXES:
                    if e.result_preview.startswith(p):
                        self.completed_errors[p] += 1

    def in_flight(self, tool: str, min_age: float = 0.1) -> int:
        now = time.monotonic()
        return sum(1 for name, t in self.running.values() if name == tool and now - t >= min_age)

    @property
    def fault_errors(self) -> int:
        """Calls a fault visibly hit: answered as crashed (and the like), or retried."""
        return sum(self.completed_errors.values()) + self.retries


class Load:
    """``n`` concurrent loops × 10 steps, driven through the loop API, followed from history."""

    def __init__(
        self,
        nc: NATS,
        settings: Settings,
        model: str,
        n: int,
        *,
        policy: dict[str, str] | None = None,
        command_timeout: float = 90.0,
        client_timeout: float = 15.0,
        follow_history: bool = True,
    ) -> None:
        """``follow_history``: wake a loop's tracker on its history subject (an identity that may not
        subscribe to ``lw.hist.>`` polls each loop every second instead)."""
        self.nc = nc
        self.settings = settings
        self.names = settings.names
        self.model = model
        self.policy = policy if policy is not None else {GATED_TOOL: "ask"}
        self.client = LoopClient(nc, self.names, timeout=client_timeout)
        self.command_timeout = command_timeout
        self.loops = {lid: LoopState(lid) for lid in (str(uuid.uuid4()) for _ in range(n))}
        self.errors: Counter[str] = Counter()  # client-visible errors: "<verb>: <kind>"
        self.observer_errors: Counter[str] = Counter()  # the tracker's own read failures
        self.progress: list[float] = []  # monotonic times at which some loop's history advanced
        self.live = LiveToolCalls()
        self.follow_history = follow_history
        self.started = 0.0
        self.ended = 0.0
        self._progress_changed = anyio.Event()

    # --- commands (retried with the same command id while unavailable)

    async def command(self, st: LoopState, verb: str, call: Callable[[str], Awaitable[ApiResult]]) -> bool:
        cid = str(uuid.uuid4())
        deadline = time.monotonic() + self.command_timeout
        while True:
            try:
                await call(cid)
            except UnavailableError:
                self.errors[f"{verb}: unavailable"] += 1
                if time.monotonic() > deadline:
                    st.unacked[cid] = verb
                    return False
                await anyio.sleep(0.3)
                continue
            except RemoteError as e:
                self.errors[f"{verb}: {e.body.kind}"] += 1
                st.unacked[cid] = verb
                return False
            st.acked[cid] = verb
            return True

    # --- progress

    @property
    def steps_committed(self) -> int:
        return sum(len(st.h.step_ids) for st in self.loops.values() if st.h is not None)

    @property
    def completed(self) -> int:
        return sum(1 for st in self.loops.values() if st.done_at)

    async def wait_progress(self, fraction: float, timeout: float = 300.0) -> None:
        """Until ``fraction`` of all steps are committed (faults land mid-load whatever the machine speed)."""
        target = fraction * STEPS * len(self.loops)
        with anyio.fail_after(timeout):
            while self.steps_committed < target and self.completed < len(self.loops):
                await self._progress_changed.wait()

    async def wait_tool_in_flight(self, tool: str, at_least: int = 1, timeout: float = 30.0) -> bool:
        """Until ``at_least`` calls of ``tool`` are running (False if the loops finish or time runs out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.completed < len(self.loops):
            if self.live.in_flight(tool) >= at_least:
                return True
            await anyio.sleep(0.02)
        return False

    def _advanced(self) -> None:
        self.progress.append(time.monotonic())
        self._progress_changed.set()
        self._progress_changed = anyio.Event()

    @property
    def max_loop_stall(self) -> float:
        return max((st.max_stall for st in self.loops.values()), default=0.0)

    @property
    def max_stall(self) -> float:
        """Longest time no loop's history advanced, between the first command and the last loop done."""
        done = [st.done_at for st in self.loops.values()]
        end = max(done) if done and all(done) else (self.ended or time.monotonic())
        marks = sorted([self.started, *(t for t in self.progress if t <= end), end])
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)

    # --- one loop

    async def _refresh(self, st: LoopState) -> LoopHistory | None:
        try:
            before = st.h.last_seq if st.h is not None else 0
            st.h = await load(self.nc, self.names, st.loop_id, st.h)
        except (JetStreamUnavailableError, JetStreamError, LoopwireError, TimeoutError) as e:
            self.observer_errors[type(e).__name__] += 1
            return st.h
        if st.h.last_seq > before:
            st.advances.append(time.monotonic())
            self._advanced()
        return st.h

    async def _drive(self, st: LoopState) -> None:
        lc, lid = self.client, st.loop_id
        ok = await self.command(
            st, "start", lambda cid: lc.start(lid, model=self.model, policy=self.policy, command_id=cid)
        )
        if ok:
            ok = await self.command(st, "input", lambda cid: lc.input(lid, "count to ten", command_id=cid))
        if not ok:
            return
        poll = 1.0 if self.follow_history else 0.3  # a wake-up normally comes first
        while True:
            with anyio.move_on_after(poll):
                await st.wake.wait()
            st.wake = anyio.Event()
            h = await self._refresh(st)
            if h is None:
                continue
            for g in h.open_gates:
                if g.gate.id not in st.answered:
                    await self._answer(st, g.gate.id, g.gate.tool_use_id)
            if finished(h):
                st.done_at = time.monotonic()
                self._advanced()
                st.closed = await self.command(st, "close", lambda cid: lc.close(lid, command_id=cid))
                return

    async def _answer(self, st: LoopState, gate_id: str, tool_use_id: str) -> None:
        """The test operator: approve ``approve_*`` calls, deny the others (with a reason the model sees)."""
        action = "approve" if tool_use_id.startswith("approve") else "deny"

        def call(cid: str) -> Awaitable[ApiResult]:
            return self.client.answer(st.loop_id, gate_id, action, reason="operator says no", command_id=cid)

        if await self.command(st, "answer", call):
            st.answered.add(gate_id)

    async def _on_hist(self, msg: Msg) -> None:
        st = self.loops.get(self.names.loop_of_hist(msg.subject))
        if st is not None:
            st.wake.set()

    async def _on_live(self, msg: Msg) -> None:
        with contextlib.suppress(LoopwireError):
            for e in decode_live_frame(msg.data):
                self.live.on_event(e)

    async def run(self, fault: Callable[[Load], Awaitable[None]] | None = None, *, timeout: float = 300.0) -> None:
        """Drive every loop to its end (or ``timeout``) while ``fault`` runs; the fault must finish too."""
        subs = [await self.nc.subscribe(self.names.live_all, cb=self._on_live)]
        if self.follow_history:
            for k in self.names.shard_ids:
                subs.append(await self.nc.subscribe(self.names.hist_all_of(k), cb=self._on_hist))
        self.started = time.monotonic()
        try:
            with anyio.move_on_after(timeout):
                async with anyio.create_task_group() as tg:
                    for st in self.loops.values():
                        tg.start_soon(self._drive, st)
                    if fault is not None:
                        tg.start_soon(fault, self)
        finally:
            self.ended = time.monotonic()
            for s in subs:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()
