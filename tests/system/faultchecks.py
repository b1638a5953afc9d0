"""The fault suite's checks, from replayed history only: one loop against the script, the operator
and the client's acknowledgements; record chaining; turn structure; where a stuck loop stands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS

from services.model_step.steps import step_id_for
from shared import events as ev
from shared import shards
from shared.content import AIMessage, ToolResultMessage, text_of, tool_uses
from shared.errors import LoopwireError
from shared.events import Event
from shared.history import COMMAND_EVENTS
from shared.settings import Settings
from shared.shaping import INVALID_JSON_ARGUMENTS
from shared.streamreads import direct_get_batch, get_msg
from shared.subjects import H_BATCH_SEQ, H_EXPECTED_LAST_SUBJECT_SEQ
from shared.verify import verify_loop as digest_check
from tests.syshelpers import check_history_invariants, history
from tests.system.faultload import LoopState
from tests.system.faultscript import CALC_RESULTS, FAULT_RESULT_PREFIXES, RESPONSES, STEPS


@dataclass
class LoopCheck:
    steps: int = 0
    terminal: str = ""
    fault_results: Counter[str] = field(default_factory=Counter)  # accepted fault texts by prefix
    violations: list[str] = field(default_factory=list)


async def chain_violations(nc: NATS, settings: Settings, loop_id: str) -> list[str]:
    """Every record (or batch) was appended expecting the loop's previous record; batches are consecutive;
    and every record is digested and follows the one before it in the loop's digest chain."""
    report = await digest_check(nc, settings.names, loop_id)
    out = [p.line() for p in report.problems]
    check = report.loops.get(loop_id)
    if check is not None and check.chained != check.records:
        out.append(f"{check.records - check.chained} of {check.records} records carry no digest")
    prev, start = 0, 1
    home = await shards.home_of(nc, settings.names, loop_id)
    while True:
        b = await direct_get_batch(nc, home.stream, home.subject, start_seq=start)
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
        shard = names.shard_of(loop_id)
        m = await get_msg(nc, names.work_stream_of(shard), last_by_subj=names.work(loop_id))
        parts.append(f"work item: {'none' if m is None else f'seq {m.seq}'}")
        ci = await js.consumer_info(names.work_stream_of(shard), names.work_consumer)
        parts.append(
            f"consumer: delivered {ci.delivered.stream_seq}, ack floor {ci.ack_floor.stream_seq}, "
            f"pending {ci.num_pending}, ack pending {ci.num_ack_pending}, redelivered {ci.num_redelivered}"
        )
        kv = await js.key_value(names.leases_bucket_of(shard))
        try:
            e = await kv.get(loop_id)
            parts.append(f"lease: {e.value!r} rev {e.revision}")
        except Exception:
            parts.append("lease: none")
    except Exception as e:  # a diagnosis, not a check
        parts.append(f"({e!r})")
    return "; ".join(parts)
