"""The fault suite's load, operator, observer and invariant checks (see docs/reliability.md).

A scenario runs N concurrent loops × 10 steps against a :class:`Fleet` (every service its own OS
process) while a fault coroutine kills, stops or restarts things. Loops are driven only through
the loop API (:class:`shared.client.LoopClient`); a test operator answers the permission gates the
script opens; results are checked only from the replayed history (:func:`verify_loop`).

The scripted model (``script()``) mixes single, parallel and malformed tool calls with two gated
calls (``clock`` is ``ask`` in the loop's policy; the operator approves ``approve_*`` gates and
denies ``deny_*`` ones). Tool-use ids carry the step index, so every StepDone can be matched to
the response that produced it: a missing, doubled or reordered step is caught.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.model_step.steps import step_id_for
from shared import events as ev
from shared import shaping
from shared.bus import JetStreamError, JetStreamUnavailableError, direct_get_batch, get_msg
from shared.client import ApiResult, LoopClient
from shared.codec import decode_live_frame
from shared.content import AIMessage, ToolResultMessage, text_of, tool_uses
from shared.errors import LoopwireError
from shared.events import Event
from shared.history import COMMAND_EVENTS, LoopHistory, load
from shared.natsserver import NatsCluster, NatsServer
from shared.procs import ServiceProcess
from shared.protocol import RemoteError, UnavailableError
from shared.settings import Settings
from shared.shaping import INVALID_JSON_ARGUMENTS
from shared.subjects import H_BATCH_SEQ, H_EXPECTED_LAST_SUBJECT_SEQ
from tests.syshelpers import System, check_history_invariants, history

STEPS = 10
SLEEP_SECONDS = 0.3
GATED_TOOL = "clock"
# Tool results a fault may legitimately produce instead of the tool's answer (the executor's texts).
FAULT_RESULT_PREFIXES = ("error: tool crashed", "error: tool timed out", "error: tool unavailable")
# While a NATS node is lost the registry may forget a tool whose workers cannot refresh their
# registration, and the executor answers calls meanwhile as "unknown tool" (see docs/reliability.md).
NODE_LOSS_RESULT_PREFIXES = (*FAULT_RESULT_PREFIXES, "error: unknown tool")

# --- the scripted model --------------------------------------------------------------------------


def _call(call_id: str, name: str, args: str, index: int = 0) -> list[dict[str, Any]]:
    return [
        {"kind": "tool_use", "index": index, "id": call_id, "name": name},
        {"kind": "tool_use", "index": index, "text": args},
    ]


def _calc(prefix: str, expr: str, index: int = 0) -> list[dict[str, Any]]:
    return _call(f"{prefix}_{{k}}", "calculator", json.dumps({"expression": expr}), index)


def _sleep(index: int = 0) -> list[dict[str, Any]]:
    return _call("sleep_{k}", "sleep", json.dumps({"seconds": SLEEP_SECONDS}), index)


def _gated(decision: str) -> list[dict[str, Any]]:
    return _call(f"{decision}_{{k}}", GATED_TOOL, json.dumps({"timezone": "UTC"}))


_FINISH_TOOLS = {"kind": "finish", "finish_reason": "tool_use"}

# Step k → the model's response. Expected results are in EXPECTED (by tool-use id prefix).
RESPONSES: list[list[dict[str, Any]]] = [
    [{"kind": "text", "text": "Step 0: one call."}, *_calc("calc", "0+1"), _FINISH_TOOLS],
    [*_calc("calc", "1+1", 0), *_sleep(1), _FINISH_TOOLS],  # parallel
    [*_call("bad_{k}", "calculator", '{"expression": "2+'), _FINISH_TOOLS],  # malformed JSON
    [{"kind": "text", "text": "Asking first."}, *_gated("approve"), _FINISH_TOOLS],  # gate: approved
    [*_sleep(0), *_calc("calc", "4+1", 1), _FINISH_TOOLS],
    [*_calc("calc", "5+1"), _FINISH_TOOLS],
    [*_gated("deny"), _FINISH_TOOLS],  # gate: denied
    [*_calc("calc", "7+1", 0), *_calc("calcb", "7*2", 1), *_sleep(2), _FINISH_TOOLS],  # three at once
    [*_sleep(0), _FINISH_TOOLS],
    [{"kind": "text", "text": "finished"}, {"kind": "finish", "finish_reason": "end_turn"}],
]
assert len(RESPONSES) == STEPS

CALC_RESULTS = {"calc_0": "1", "calc_1": "2", "calc_4": "5", "calc_5": "6", "calc_7": "8", "calcb_7": "14"}


def script(sleep_seconds: float = SLEEP_SECONDS) -> dict[str, Any]:
    """The load's script; ``sleep_seconds`` lengthens the sleep calls (more calls in flight at any time)."""
    text = json.dumps({"responses": RESPONSES})
    return json.loads(
        text.replace(
            json.dumps(json.dumps({"seconds": SLEEP_SECONDS}))[1:-1],
            json.dumps(json.dumps({"seconds": sleep_seconds}))[1:-1],
        )
    )


def quick_script() -> list[Any]:
    """A two-step loop for "is the system still serving?" checks."""
    return [[*_calc("calc", "20+22"), _FINISH_TOOLS], "quick done"]


def write_model(directory: Path, content: Any, name: str) -> str:
    path = directory / name
    path.write_text(json.dumps(content))
    return f"scripted:{path}"


# --- the fleet -----------------------------------------------------------------------------------

ROLES: dict[str, list[str]] = {
    "committer": ["-m", "services.committer"],
    "model-step": ["-m", "services.model_step"],
    "tools-calc": ["-m", "services.tools", "calculator", "clock"],
    "tools-sleep": ["-m", "services.tools", "sleep"],
    # one tool per process (a NATS identity per tool: see test_security)
    "tools-calculator": ["-m", "services.tools", "calculator"],
    "tools-clock": ["-m", "services.tools", "clock"],
    # records every execution it starts in the file LW_LEDGER names (tests/system/ledger_tool.py)
    "tools-ledger": [
        "-m",
        "services.tools",
        "tests.system.ledger_tool:ledger",
        "tests.system.ledger_tool:ledger_idem",
        "tests.system.ledger_tool:ledger_destructive",
    ],
}
DEFAULT_FLEET: dict[str, int] = {"committer": 2, "model-step": 2, "tools-calc": 2, "tools-sleep": 2}


@dataclass
class Fleet:
    """Service processes of one scenario (a :class:`System`), started and replaced without blocking the loop."""

    sysm: System
    cluster: NatsCluster | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)  # e.g. each role's NATS identity

    @property
    def settings(self) -> Settings:
        return self.sysm.settings

    def new_process(self, role: str, env: dict[str, str] | None = None) -> ServiceProcess:
        full = {**self.sysm.env, **self.role_env.get(role, {}), **(env or {})}
        return ServiceProcess(role, ROLES[role], full, log_path=self.sysm._log(role))

    def start_all(self, counts: dict[str, int], timeout: float = 60.0) -> None:
        """Start every process at once, then wait for each READY (main thread: PDEATHSIG)."""
        procs = [self.new_process(role) for role, n in counts.items() for _ in range(n)]
        for p in procs:
            self.sysm.sup.start(p, wait=False)
        for p in procs:
            p.wait_ready(timeout)

    def live(self, role: str) -> list[ServiceProcess]:
        return [p for p in self.sysm.sup.by_name(role) if p.running]

    def pick(self, role: str) -> ServiceProcess:
        return self.rng.choice(self.live(role))

    async def spawn(self, role: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> ServiceProcess:
        p = self.new_process(role, env)
        self.sysm.sup.start(p, wait=False)  # Popen here, in the event loop's (main) thread
        await anyio.to_thread.run_sync(p.wait_ready, timeout)
        return p

    async def replace(self, old: ServiceProcess) -> ServiceProcess:
        """A fresh process of ``old``'s role; ``old`` (already dead) is forgotten."""
        old.kill()
        self.sysm.sup.services.remove(old)
        return await self.spawn(old.name, timeout=60)

    async def stop(self, p: ServiceProcess, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful drain) without blocking the event loop."""
        code = await anyio.to_thread.run_sync(p.stop, timeout)
        self.sysm.sup.services.remove(p)
        return code

    def all_running(self) -> list[str]:
        """Names of processes that died unexpectedly (empty when every one runs)."""
        return [
            f"{p.name}[{p.proc.pid if p.proc else '?'}] exit {p.proc.poll() if p.proc else '?'}"
            for p in self.sysm.sup.services
            if not p.running
        ]


@contextmanager
def fleet(
    settings: Settings,
    cluster: NatsCluster | None = None,
    counts: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    role_env: dict[str, dict[str, str]] | None = None,
) -> Iterator[Fleet]:
    """Start the fleet (logs in ``log_dir``, e.g. pytest's tmp_path so they outlive a failure, else a temp dir)."""
    base_env = {
        "LW_NATS_URL": ",".join(settings.nats_urls),
        "LW_PREFIX": settings.prefix,
        "LW_REPLICAS": str(settings.replicas),
        "LW_LOG_LEVEL": "INFO",
        **(env or {}),
    }
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-faults-")))
        log_dir.mkdir(parents=True, exist_ok=True)
        s = System(settings=settings, log_dir=log_dir, env=base_env)
        f = Fleet(sysm=s, cluster=cluster, role_env=role_env or {})
        try:
            f.start_all(counts or DEFAULT_FLEET)
            yield f
        except BaseException:
            print(s.logs())
            raise
        finally:
            s.sup.stop_all()


# --- the load ------------------------------------------------------------------------------------


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
            subs.append(await self.nc.subscribe(self.names.hist_all, cb=self._on_hist))
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


# --- checks on replayed history ------------------------------------------------------------------


@dataclass
class LoopCheck:
    steps: int = 0
    terminal: str = ""
    fault_results: Counter[str] = field(default_factory=Counter)  # accepted fault texts by prefix
    violations: list[str] = field(default_factory=list)


async def chain_violations(nc: NATS, settings: Settings, loop_id: str) -> list[str]:
    """Every record (or batch) was appended expecting the loop's previous record; batches are consecutive."""
    out: list[str] = []
    prev, start = 0, 1
    names = settings.names
    while True:
        b = await direct_get_batch(nc, names.history_stream, names.hist(loop_id), start_seq=start)
        for m in b.messages:
            in_batch = m.headers.get(H_BATCH_SEQ, "1") != "1"
            expected = m.headers.get(H_EXPECTED_LAST_SUBJECT_SEQ)
            if in_batch and m.seq != prev + 1:
                out.append(f"batch member at {m.seq} does not follow {prev}")
            if not in_batch and expected != str(prev):
                out.append(f"record {m.seq} expected predecessor {expected}, the loop's previous is {prev}")
            prev = m.seq
        if not b.messages or b.num_pending == 0:
            return out
        start = b.messages[-1].seq + 1


TURN_ENDS = (ev.TurnDone, ev.TurnFailed, ev.TurnInterrupted)


def turn_violations(events: Sequence[tuple[int, Event]], *, settled: bool = True) -> list[str]:
    """Turn structure from stored records alone, whatever the script: every turn starts once and
    ends at most once (exactly once when ``settled``), holds exactly its steps — step k of a turn is
    ``step_id_for(turn, k)``, in order, none after the turn's end — and every input is consumed
    (started or folded into a turn) at most once, exactly once when ``settled``."""
    out: list[str] = []
    started: dict[str, int] = {}
    ended: dict[str, int] = {}
    steps: dict[str, list[str]] = {}
    inputs: list[str] = []
    consumed: Counter[str] = Counter()
    for seq, e in events:
        turn = getattr(e, "turn_id", "")
        if isinstance(e, ev.InputSubmitted):
            inputs.append(e.event_id)
        elif isinstance(e, ev.TurnStarted):
            if turn in started:
                out.append(f"turn {turn[:8]} started again at {seq}")
            started[turn] = seq
            steps[turn] = []
            if e.cause is not None:
                consumed[e.cause.event_id] += 1
        elif isinstance(e, ev.TurnFoldedInto) and e.cause is not None:
            consumed[e.cause.event_id] += 1
        if isinstance(e, ev.StepDone | ev.TurnFoldedInto | ev.GateOpened | ev.PermissionDecided):
            if turn not in started:
                out.append(f"{type(e).__name__} at {seq} for turn {turn[:8]} that never started")
            elif turn in ended:
                out.append(f"{type(e).__name__} at {seq} after turn {turn[:8]} ended at {ended[turn]}")
        if isinstance(e, ev.StepDone) and turn in steps:
            want = step_id_for(turn, len(steps[turn]))
            if e.step_id != want:
                out.append(f"step at {seq} is {e.step_id[:8]}, turn {turn[:8]} expects step {len(steps[turn])}")
            steps[turn].append(e.step_id)
        if isinstance(e, TURN_ENDS):
            if turn in ended:
                out.append(f"turn {turn[:8]} ended again at {seq}")
            ended.setdefault(turn, seq)
    for cause, n in consumed.items():
        if n > 1:
            out.append(f"input {cause[:8]} consumed {n} times")
    if settled:
        out += [f"turn {t[:8]} never ended" for t in started if t not in ended]
        out += [f"input {i[:8]} never consumed" for i in inputs if consumed[i] == 0]
    return out


def _check_result(
    tool_use_id: str, name: str, result: ToolResultMessage, check: LoopCheck, k: int, accepted: tuple[str, ...]
) -> None:
    text = text_of(result)
    if result.tool_use_id != tool_use_id:
        check.violations.append(f"step {k}: result for {result.tool_use_id}, expected {tool_use_id}")
        return
    prefix = tool_use_id.rsplit("_", 1)[0]
    if prefix == "bad":
        if not (result.is_error and text == INVALID_JSON_ARGUMENTS):
            check.violations.append(f"step {k}: malformed call answered {text!r}")
        return
    if prefix == "deny":
        if not (result.is_error and text.startswith("error: permission denied") and "operator says no" in text):
            check.violations.append(f"step {k}: denied call answered {text!r}")
        return
    if result.is_error and text.startswith(accepted):
        check.fault_results[next(p for p in accepted if text.startswith(p))] += 1
        return
    if prefix in ("calc", "calcb"):
        want = CALC_RESULTS[tool_use_id]
        if result.is_error or text != want:
            check.violations.append(f"step {k}: {tool_use_id} answered {text!r}, expected {want!r}")
    elif prefix == "sleep":
        if result.is_error or not text.startswith("slept"):
            check.violations.append(f"step {k}: sleep answered {text!r}")
    elif prefix == "approve":
        if result.is_error:
            check.violations.append(f"step {k}: approved {name} answered {text!r}")
    else:
        check.violations.append(f"step {k}: unexpected tool use {tool_use_id}")


def check_events(
    events: Sequence[tuple[int, Event]],
    st: LoopState,
    *,
    closed: bool,
    accepted: tuple[str, ...] = FAULT_RESULT_PREFIXES,
) -> LoopCheck:
    """The replayed history of one load loop against the script, the operator and the client's acks."""
    c = LoopCheck()
    try:
        check_history_invariants(events)
    except AssertionError as e:
        c.violations.append(f"invariant: {e}")
    steps = [e for _, e in events if isinstance(e, ev.StepDone)]
    gated: list[str] = []
    c.steps = len(steps)
    if len(steps) != STEPS:
        c.violations.append(f"{len(steps)} steps committed, expected {STEPS}")
    for k, s in enumerate(steps):
        ai = s.messages[0]
        assert isinstance(ai, AIMessage)
        uses = tool_uses(ai)
        want = [item["id"].replace("{k}", str(k)) for item in RESPONSES[k] if "id" in item] if k < STEPS else []
        if [u.id for u in uses] != want:
            c.violations.append(f"step {k}: tool uses {[u.id for u in uses]}, expected {want}")
            continue
        results = s.messages[1:]
        for u, r in zip(uses, results, strict=False):
            assert isinstance(r, ToolResultMessage)
            _check_result(u.id, u.name, r, c, k, accepted)
            # A gated call reaches authorisation (and opens a gate) unless it was refused before:
            # only "unknown tool" (the registry had no worker at the time) does that here.
            if u.id.startswith(("approve_", "deny_")) and not text_of(r).startswith("error: unknown tool"):
                gated.append(u.id)
    if steps and text_of(steps[-1].messages[0]) != "finished":
        c.violations.append("the last step is not the script's final answer")
    names = [type(e).__name__ for _, e in events]
    enders = [n for n in names if n in ("TurnDone", "TurnFailed", "TurnInterrupted")]
    c.terminal = enders[-1] if enders else "(open)"
    tail = ["TurnDone", "LoopIdle", "LoopClosed"] if closed else ["TurnDone", "LoopIdle"]
    if names[-len(tail) :] != tail:
        c.violations.append(f"history ends {names[-3:]}, expected {tail}")
    if names.count("TurnStarted") != 1:
        c.violations.append(f"{names.count('TurnStarted')} turns")
    # gates: one per gated call, each resolved exactly once by the operator as the call's id says
    opened = [e for _, e in events if isinstance(e, ev.GateOpened)]
    resolved = [e for _, e in events if isinstance(e, ev.GateResolved)]
    if [g.gate.tool_use_id for g in opened] != gated:
        c.violations.append(f"gates opened for {[g.gate.tool_use_id for g in opened]}, expected {gated}")
    if sorted(r.gate_id for r in resolved) != sorted(g.gate.id for g in opened):
        c.violations.append("gates and their resolutions do not pair one to one")
    if [r.action for r in resolved] != [g.split("_")[0] for g in gated]:
        c.violations.append(f"gate actions {[r.action for r in resolved]} for {gated}")
    if any(r.resolver != "operator" for r in resolved):
        c.violations.append(f"gate resolvers {[r.resolver for r in resolved]}")
    # every acknowledged command exactly once; an unacknowledged one at most once
    by_cmd = Counter(e.cause.command_id for _, e in events if isinstance(e, COMMAND_EVENTS) and e.cause is not None)
    for cid, verb in st.acked.items():
        if by_cmd[cid] != 1:
            c.violations.append(f"acknowledged {verb} {cid} is reflected {by_cmd[cid]} times")
    for cid, verb in st.unacked.items():
        if by_cmd[cid] > 1:
            c.violations.append(f"unacknowledged {verb} {cid} is reflected {by_cmd[cid]} times")
    unknown = set(by_cmd) - set(st.acked) - set(st.unacked)
    if unknown:
        c.violations.append(f"commands nobody sent: {sorted(unknown)}")
    return c


async def verify_loop(
    nc: NATS, settings: Settings, st: LoopState, accepted: tuple[str, ...] = FAULT_RESULT_PREFIXES
) -> LoopCheck:
    try:
        events = await history(nc, settings, st.loop_id)
    except LoopwireError as e:
        return LoopCheck(violations=[f"history does not replay: {e!r}"])
    c = check_events(events, st, closed=st.closed, accepted=accepted)
    c.violations.extend(await chain_violations(nc, settings, st.loop_id))
    return c


async def why_stuck(nc: NATS, settings: Settings, loop_id: str) -> str:
    """Where a loop that did not finish stands outside its history: its work item, the work
    consumer's counts and its lease (what tells a lost wake-up from a drive that never ends)."""
    names = settings.names
    js = nc.jetstream()
    parts: list[str] = []
    try:
        m = await get_msg(nc, names.work_stream, last_by_subj=names.work(loop_id))
        parts.append(f"work item: {'none' if m is None else f'seq {m.seq}'}")
        ci = await js.consumer_info(names.work_stream, names.work_consumer)
        parts.append(
            f"consumer: delivered {ci.delivered.stream_seq}, ack floor {ci.ack_floor.stream_seq}, "
            f"pending {ci.num_pending}, ack pending {ci.num_ack_pending}, redelivered {ci.num_redelivered}"
        )
        kv = await js.key_value(names.leases_bucket)
        try:
            e = await kv.get(loop_id)
            parts.append(f"lease: {e.value!r} rev {e.revision}")
        except Exception:
            parts.append("lease: none")
    except Exception as e:  # a diagnosis, not a check
        parts.append(f"({e!r})")
    return "; ".join(parts)


# --- a scenario's report -------------------------------------------------------------------------


@dataclass
class ScenarioReport:
    scenario: str
    loops: int
    loops_completed: int = 0
    steps_committed: int = 0
    wall_seconds: float = 0.0
    max_stall_seconds: float = 0.0  # no loop at all advanced
    max_loop_stall_seconds: float = 0.0  # one loop did not advance (normal waits included)
    client_errors: dict[str, int] = field(default_factory=dict)
    tool_fault_results: dict[str, int] = field(default_factory=dict)
    tool_retries: int = 0  # seen on the live subjects (a retried call's result is the tool's answer)
    observer_read_errors: int = 0
    faults: list[str] = field(default_factory=list)
    fresh_loops_ok: bool = False
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_table(reports: Sequence[ScenarioReport]) -> str:
    head = (
        "scenario",
        "loops done",
        "steps",
        "wall s",
        "max stall s (all loops)",
        "max stall s (one loop)",
        "client errors",
        "tool fault results",
        "violations",
    )
    rows = [
        (
            r.scenario,
            f"{r.loops_completed}/{r.loops}",
            str(r.steps_committed),
            f"{r.wall_seconds:.1f}",
            f"{r.max_stall_seconds:.1f}",
            f"{r.max_loop_stall_seconds:.1f}",
            ", ".join(f"{k}×{v}" for k, v in sorted(r.client_errors.items())) or "0",
            ", ".join(
                [f"{k.removeprefix('error: ')}×{v}" for k, v in sorted(r.tool_fault_results.items())]
                + ([f"retried×{r.tool_retries}"] if r.tool_retries else [])
            )
            or "0",
            str(len(r.violations)),
        )
        for r in reports
    ]
    widths = (
        [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)] if rows else [len(h) for h in head]
    )
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in rows]
    return "\n".join(lines)


# --- nats-server helpers (blocking calls moved off the event loop) --------------------------------


async def stream_leader(cluster: NatsCluster, stream: str, timeout: float = 30.0) -> NatsServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await anyio.to_thread.run_sync(cluster.stream_leader, stream)
        if leader is not None:
            return leader
        await anyio.sleep(0.2)
    raise TimeoutError(f"no leader for {stream}")


async def restart_node(cluster: NatsCluster, node: NatsServer, timeout: float = 60.0) -> None:
    node.start(wait=False)  # Popen in the main thread (PDEATHSIG)
    await anyio.to_thread.run_sync(lambda: node.wait_ready(timeout=timeout, jetstream=False))
    await anyio.to_thread.run_sync(lambda: cluster.wait_meta_leader(timeout=timeout))


def restore_cluster(cluster: NatsCluster) -> None:
    """Start every node that is down (a failed scenario must not leave the module's cluster broken)."""
    for node in cluster.nodes:
        if not node.running:
            node.start(wait=False)
    for node in cluster.nodes:
        node.wait_ready(timeout=30, jetstream=False)
    cluster.wait_meta_leader(timeout=30)


def sigstop(p: ServiceProcess) -> None:
    p.signal(signal.SIGSTOP)


def sigcont(p: ServiceProcess) -> None:
    p.signal(signal.SIGCONT)
