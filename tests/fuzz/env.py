"""The fuzz campaign's world: a nats-server, real service processes, a corpus, and one runner per boundary.

:func:`fuzz_env` starts a committer and a tool worker (plus, only while the corpus is captured, a
model-step and a sleep worker) as OS processes on a fresh nats-server. The corpus comes from a real
run: the stored records of loops driven by the fault suite's scripted model (tool calls, parallel
calls, malformed JSON, approved and denied gates, a failed turn), the ephemeral events seen on
``lw.live.>``, and valid loop-API bodies and tool arguments. Then the model-step stops, so the
committer is the only writer left and every change of the history stream is accounted for.

Each case is classified (see :class:`Stats`):

* ``accepted`` — a valid message (mutations sometimes produce one) was applied;
* ``rejected`` — a structured error reply (by ``error.kind``; tools: an error result or error reply);
* failures: ``crash`` (the service died, answered "internal error", or the codec raised anything but
  its typed errors), ``hang`` (no final reply in time), ``unstructured`` (a reply that is not the
  protocol's error shape), ``stream_write`` (the history stream changed on rejected input, or
  changed by other than what an accepted commit reported).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec
import nats.errors
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, Phase, given
from hypothesis import seed as hseed
from hypothesis import settings as hsettings
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.deployment import Deployment, service_command, tool_command
from services.toolwire import protocol as tp
from shared import strictjson
from shared.client import LoopClient
from shared.codec import decode_event, decode_live, decode_live_frame, encode_event
from shared.connect import connect
from shared.errors import ErrorKind, LoopwireError
from shared.natsserver import NatsServer
from shared.procs import ServiceProcess
from shared.protocol import REQUEST_TYPES, ApiReply, CommitReply, WireError, decode_request
from shared.replay import load
from shared.settings import Settings
from shared.streamreads import direct_get_batch, get_msg
from shared.subjects import H_DEADLINE, H_REPLY_KIND, H_STATUS
from tests.fuzz.gen import CURRENT_SEQ, STRATEGIES, ApiCase, CodecCase, CommitCase, Corpus, ToolCase
from tests.system.faultload import Load
from tests.system.faultscript import quick_script, script, write_model

HANG_SECONDS: Final = 20.0  # no final reply by then: a hang (the committer's own retry budget is 10 s)
CODEC_HANG_SECONDS: Final = 5.0
FUZZ_TOOLS: Final = ("calculator", "clock", "kv_memory", "read_file", "list_dir", "ask_user")
FAILURES: Final = ("crash", "hang", "unstructured", "stream_write")
_KINDS: Final = frozenset(k.value for k in ErrorKind)


@dataclass
class Result:
    outcome: str  # accepted | rejected | crash | hang | unstructured | stream_write
    detail: str = ""


@dataclass
class Stats:
    boundary: str
    cases: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    crash: int = 0
    hang: int = 0
    unstructured: int = 0
    stream_write: int = 0
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)  # the first failures, for a report
    harness_error: str = ""  # the campaign itself broke (not the target): the run fails

    @property
    def failures(self) -> int:
        return self.crash + self.hang + self.unstructured + self.stream_write + bool(self.harness_error)

    def record(self, case: Any, r: Result) -> None:
        self.cases += 1
        if r.outcome == "accepted":
            self.accepted += 1
        elif r.outcome == "rejected":
            self.rejected[r.detail] += 1
        else:
            setattr(self, r.outcome, getattr(self, r.outcome) + 1)
            if len(self.examples) < 10:
                self.examples.append(f"{r.outcome}: {r.detail} — case {_short(case)}")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rejected"] = dict(self.rejected)
        return d


def _short(case: Any, n: int = 300) -> str:
    text = repr(case)
    return text if len(text) <= n else text[:n] + f"... ({len(text)} chars)"


_commit_reply = msgspec.json.Decoder(CommitReply)
_api_reply = msgspec.json.Decoder(ApiReply)


def _classify_reply(data: bytes, decoder: msgspec.json.Decoder[Any]) -> Result:
    """A committer reply: accepted, a structured rejection, an internal error (crash) or unstructured."""
    try:
        reply = decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Result("unstructured", f"reply does not decode: {e}: {data[:200]!r}")
    if reply.ok:
        return Result("accepted") if reply.error is None else Result("unstructured", "ok with an error")
    err = reply.error
    if err is None or err.kind not in _KINDS or not err.message:
        return Result("unstructured", f"error without kind/message: {data[:200]!r}")
    if err.message.startswith("internal error"):
        return Result("crash", err.message)
    return Result("rejected", err.kind)


@dataclass
class FuzzEnv:
    settings: Settings
    server: NatsServer
    deployment: Deployment
    portal: BlockingPortal
    nc: NATS
    committer: ServiceProcess
    worker: ServiceProcess
    log_dir: Path
    corpus: Corpus = field(default_factory=Corpus)

    # --- helpers running in the portal's event loop

    async def _stream_state(self) -> tuple[int, int]:
        info = await self.nc.jetstream().stream_info(self.settings.names.history_stream)
        return int(info.state.messages), int(info.state.last_seq)

    async def _last_seq(self, loop_id: str) -> int:
        m = await get_msg(self.nc, self.settings.names.history_stream, last_by_subj=self.settings.names.hist(loop_id))
        return m.seq if m is not None else 0

    def _alive(self, p: ServiceProcess) -> Result | None:
        if p.running:
            return None
        detail = f"{p.name} exited with {p.proc.poll() if p.proc else '?'}: {p.log_tail(10)}"
        self._restart(p)
        return Result("crash", detail)

    def _restart(self, p: ServiceProcess) -> None:
        """Keep the campaign going after a crash (it is already counted)."""
        fresh = self.deployment.replace(p, timeout=60)
        if p is self.committer:
            self.committer = fresh
        else:
            self.worker = fresh

    # --- one case per boundary

    async def _commit(self, case: CommitCase) -> Result:
        body = case.body
        marker = str(CURRENT_SEQ).encode()
        if marker in body:
            body = body.replace(marker, str(await self._last_seq(self.corpus.loop_id)).encode())
        before = await self._stream_state()
        try:
            msg = await self.nc.request(self.settings.names.commit(case.loop_token), body, timeout=HANG_SECONDS)
        except nats.errors.TimeoutError:
            return Result("hang", f"no reply within {HANG_SECONDS:g}s")
        except nats.errors.NoRespondersError:
            return Result("crash", "no committer is serving")
        r = _classify_reply(msg.data, _commit_reply)
        after = await self._stream_state()
        if r.outcome == "accepted":
            seqs = _commit_reply.decode(msg.data).seqs or []
            if after[0] != before[0] + len(seqs):
                return Result("stream_write", f"{len(seqs)} acknowledged, stream grew {before} → {after}")
        elif after != before:
            return Result("stream_write", f"{r.outcome} {r.detail} yet the stream moved {before} → {after}")
        return r

    async def _api(self, case: ApiCase) -> Result:
        before = await self._stream_state()
        try:
            msg = await self.nc.request(
                self.settings.names.api(case.loop_token, case.verb), case.body, timeout=HANG_SECONDS
            )
        except nats.errors.TimeoutError:
            return Result("hang", f"no reply within {HANG_SECONDS:g}s")
        except nats.errors.NoRespondersError:
            return Result("crash", "no committer is serving")
        r = _classify_reply(msg.data, _api_reply)
        if r.outcome != "accepted" and await self._stream_state() != before:
            return Result("stream_write", f"{r.outcome} {r.detail} yet the stream moved")
        return r

    async def _tool(self, case: ToolCase) -> Result:
        before = await self._stream_state()
        headers = dict(case.headers)
        if case.deadline_ms is not None:
            headers[H_DEADLINE] = str(tp.now_ms() + case.deadline_ms)
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        try:
            await self.nc.publish(self.settings.names.tool(case.tool), case.body, reply=inbox, headers=headers or None)
            deadline = time.monotonic() + HANG_SECONDS
            while True:
                try:
                    m: Msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
                except nats.errors.TimeoutError:
                    return Result("hang", f"no final reply within {HANG_SECONDS:g}s")
                r = _classify_tool_reply(m)
                if r is not None:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if await self._stream_state() != before:
            return Result("stream_write", "a tool request changed the history stream")
        return r

    def _codec(self, case: CodecCase) -> Result:
        t0 = time.monotonic()
        r = _codec_case(case.data)
        if r.outcome in ("accepted", "rejected") and time.monotonic() - t0 > CODEC_HANG_SECONDS:
            return Result("hang", f"took {time.monotonic() - t0:.1f}s")
        return r

    def execute(self, boundary: str, case: Any) -> Result:
        if boundary == "codec":
            return self._codec(case)
        runner = {"commit": self._commit, "api": self._api, "tool": self._tool}[boundary]
        try:
            r: Result = self.portal.call(runner, case)
        except (LoopwireError, nats.errors.Error) as e:  # the harness's own reads failed: not the target's fault
            r = Result("hang", f"harness read failed: {e!r}")
        target = self.worker if boundary == "tool" else self.committer
        return self._alive(target) or r


def _classify_tool_reply(m: Msg) -> Result | None:
    """None for a progress reply; else the final outcome of the call."""
    h = m.headers or {}
    if h.get(H_STATUS) == "503":
        return Result("crash", "no worker is serving")
    kind = h.get(H_REPLY_KIND, "")
    try:
        if kind == tp.REPLY_PROGRESS:
            tp.decode_progress(m.data)
            return None
        if kind == tp.REPLY_RESULT:
            res = tp.decode_result(m.data)
            return Result("rejected", "tool_error") if res.is_error else Result("accepted")
        if kind == tp.REPLY_ERROR:
            err = tp.decode_error(m.data)
            if err.kind == tp.ERROR_INTERNAL:
                return Result("crash", f"worker internal error: {err.message}")
            return Result("rejected", err.kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Result("unstructured", f"{kind} reply does not decode: {e}")
    return Result("unstructured", f"reply kind {kind!r}")


def _codec_case(data: bytes) -> Result:
    """Decode ``data`` as a durable record, a live event, a request of every verb and strict JSON."""
    outcome = Result("rejected", "record")
    try:
        event = decode_event(data)
    except LoopwireError as e:
        outcome = Result("rejected", type(e).__name__)
    except Exception as e:
        return Result("crash", f"decode_event raised {e!r}")
    else:
        try:
            again = decode_event(encode_event(event))
        except Exception as e:
            return Result("crash", f"an accepted record does not re-encode and decode: {e!r}")
        if again != event:
            return Result("crash", "an accepted record changes on a round trip")
        outcome = Result("accepted")
    for decode in (decode_live, decode_live_frame):
        try:
            decode(data)
        except LoopwireError:
            pass
        except Exception as e:
            return Result("crash", f"{decode.__name__} raised {e!r}")
    for verb, cls in REQUEST_TYPES.items():
        try:
            decode_request(data, cls)
        except WireError:
            pass
        except Exception as e:
            return Result("crash", f"decode_request({verb}) raised {e!r}")
    try:
        strictjson.loads(data)
    except strictjson.StrictJSONError:
        pass
    except Exception as e:
        return Result("crash", f"strictjson.loads raised {e!r}")
    return outcome


def run_boundary(env: FuzzEnv, boundary: str, cases: int, *, derandomize: bool, seed: int | None = None) -> Stats:
    """Generate ``cases`` cases for ``boundary`` with hypothesis and run each (never stopping on a failure)."""
    stats = Stats(boundary)
    strategy = STRATEGIES[boundary](env.corpus)

    @hsettings(
        max_examples=cases,
        derandomize=derandomize,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(strategy)
    def one(case: Any) -> None:
        stats.record(case, env.execute(boundary, case))

    if seed is not None and not derandomize:
        one = hseed(seed)(one)
    t0 = time.monotonic()
    try:
        one()
    except Exception as e:  # the harness itself failed (a generator bug): report it, let other boundaries run
        stats.harness_error = f"{type(e).__name__}: {e}"[:2000]
    stats.seconds = time.monotonic() - t0
    return stats


# --- start-up and the corpus ------------------------------------------------------------------------


@contextlib.contextmanager
def fuzz_env(log_dir: Path) -> Iterator[FuzzEnv]:
    log_dir.mkdir(parents=True, exist_ok=True)
    root = log_dir / "tool-root"
    (root / "sub").mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("hello\n")
    server = NatsServer(name="fuzz").start()
    settings = Settings.from_env({}, nats_urls=(server.url,), prefix="fz" + uuid.uuid4().hex[:8])
    extra = {"LW_TOOL_ROOT": str(root), "LW_TOOL_TIMEOUT_SECONDS": "10"}
    d = Deployment.for_settings(settings, log_dir, log_level="WARNING", env=extra)
    try:
        committer = d.start("committer", service_command("committer"), timeout=60)
        worker = d.start("tools", tool_command(*FUZZ_TOOLS), timeout=60)
        helpers = [
            d.start("model-step", service_command("model-step"), timeout=60),
            d.start("tools-sleep", tool_command("sleep"), timeout=60),
        ]
        with start_blocking_portal("asyncio") as portal:
            nc = portal.call(connect, settings)
            fe = FuzzEnv(settings, server, d, portal, nc, committer, worker, log_dir)
            try:
                fe.corpus = portal.call(_capture_corpus, fe)
                for p in helpers:  # from now on the committer is the only writer
                    p.stop(timeout=15)
                yield fe
            finally:
                portal.call(nc.close)
    finally:
        d.stop_all()
        server.cleanup()


async def _capture_corpus(fe: FuzzEnv) -> Corpus:
    nc, names = fe.nc, fe.settings.names
    live: list[dict[str, Any]] = []
    sub = await nc.subscribe(names.live_all, cb=_live_sampler(live))
    full, failed = await _run_scripted_loops(fe)
    gated, gate_id = await _loop_at_open_gate(fe, full.client)
    await sub.unsubscribe()
    # 4. the commit target: a started loop nobody drives
    target = str(uuid.uuid4())
    await full.client.start(target, model="demo")
    envelopes = await _envelopes_as(fe, [*full.loops, *failed.loops, gated], target)
    message = next(e["message"] for e in envelopes if e["type"] == "InputSubmitted")
    closed = next(iter(full.loops))
    return Corpus(
        loop_id=target,
        envelopes=envelopes,
        live=live or [{"v": 1, "type": "TokenDelta", "loop_id": target}],
        api_bodies=_api_bodies(message, gate_id),
        api_loops=[target, closed, gated, str(uuid.uuid4())],
        tool_args=_tool_args(),
    )


def _live_sampler(live: list[dict[str, Any]]) -> Callable[[Msg], Awaitable[None]]:
    """A ``lw.live.>`` callback that keeps up to 5 events of each type in ``live``."""
    seen_types: Counter[str] = Counter()

    async def on_live(m: Msg) -> None:
        with contextlib.suppress(LoopwireError):
            for e, doc in zip(decode_live_frame(m.data), json.loads(m.data), strict=True):
                t = type(e).__name__
                if seen_types[t] < 5:
                    seen_types[t] += 1
                    live.append(doc)

    return on_live


async def _run_scripted_loops(fe: FuzzEnv) -> tuple[Load, Load]:
    """Run the fault suite's script to closed, and a failed turn; returns both loads."""
    nc, s = fe.nc, fe.settings
    # 1. the fault suite's script (tools, parallel calls, malformed JSON, approved and denied gates), closed
    full = Load(nc, s, write_model(fe.log_dir, script(), "script.json"), 1)
    # 2. a failed turn (empty response)
    empty = write_model(fe.log_dir, [[{"kind": "finish", "finish_reason": "end_turn"}]], "empty.json")
    failed = Load(nc, s, empty, 1, policy={})
    with anyio.fail_after(120):
        await full.run(timeout=100)
        await failed.run(timeout=100)
    return full, failed


async def _loop_at_open_gate(fe: FuzzEnv, lc: LoopClient) -> tuple[str, str]:
    """3. a loop left waiting at an open gate (the answer verb gets a real gate to aim at): (loop, gate)."""
    gated = str(uuid.uuid4())
    await lc.start(gated, model=write_model(fe.log_dir, quick_script(), "quick.json"), policy={"calculator": "ask"})
    await lc.input(gated, "go")
    gate_id = ""
    with anyio.fail_after(60):
        while not gate_id:
            h = await load(fe.nc, fe.settings.names, gated)
            gate_id = h.open_gates[0].gate.id if h.open_gates else ""
            await anyio.sleep(0.1)
    return gated, gate_id


async def _envelopes_as(fe: FuzzEnv, loop_ids: list[str], target: str) -> list[dict[str, Any]]:
    """Every stored record of ``loop_ids``, as JSON documents re-addressed to the loop ``target``."""
    names = fe.settings.names
    envelopes: list[dict[str, Any]] = []
    for loop_id in loop_ids:
        start = 1
        while True:
            b = await direct_get_batch(fe.nc, names.history_stream, names.hist(loop_id), start_seq=start)
            for m in b.messages:
                doc = json.loads(m.data)
                doc["loop_id"] = target
                envelopes.append(doc)
            if not b.messages or b.num_pending == 0:
                break
            start = b.messages[-1].seq + 1
    return envelopes


def _api_bodies(message: Any, gate_id: str) -> dict[str, list[dict[str, Any]]]:
    """Valid loop-API request bodies per verb (``message``: a stored user message; ``gate_id``: an open gate)."""

    def new() -> str:
        return str(uuid.uuid4())

    return {
        "start": [
            {"command_id": new(), "model": "demo"},
            {
                "command_id": new(),
                "model": "scripted:/nonexistent.json",
                "system": "be brief",
                "tools": ["calculator"],
                "policy": {"calculator": "ask", "*": "allow"},
                "default_policy": "deny",
                "limits": {
                    "max_iterations": 3,
                    "max_calls_per_turn": 5,
                    "max_parallel": 2,
                    "max_result_bytes": 1024,
                    "max_tokens": 100,
                },
            },
        ],
        "input": [{"command_id": new(), "text": "hello"}, {"command_id": new(), "message": message}],
        "answer": [
            {"command_id": new(), "gate_id": gate_id, "action": "approve"},
            {"command_id": new(), "gate_id": gate_id, "action": "deny", "reason": "no", "text": ""},
            {"command_id": new(), "gate_id": new(), "action": "reply", "text": "hi"},
        ],
        "interrupt": [{"command_id": new()}],
        "close": [{"command_id": new()}],
        "budget": [
            {"command_id": new(), "budget": {"max_total_tokens": 1000, "on_budget": "ask"}},
            {"command_id": new(), "budget": {"max_steps_per_turn": 3, "max_turn_seconds": 1.5}},
        ],
    }


def _tool_args() -> dict[str, list[dict[str, Any]]]:
    """Valid arguments for each fuzzed tool (paths are under the worker's tool root)."""
    return {
        "calculator": [{"expression": "1+2*(3-4)/5"}, {"expression": "2**10 % 7"}],
        "clock": [{"timezone": "Europe/Paris"}, {}],
        "kv_memory": [
            {"action": "remember", "key": "k", "value": "v"},
            {"action": "recall", "key": "k"},
            {"action": "list"},
        ],
        "read_file": [{"path": "a.txt"}, {"path": "."}],
        "list_dir": [{"path": "."}, {"path": "sub"}],
        "ask_user": [{"question": "q", "choices": ["a", "b"]}],
    }
