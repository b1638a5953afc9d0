"""What the console shows, derived from committed events: pure functions, no I/O.

:class:`LoopSummary` projects a lean :class:`~shared.history.LoopHistory` of one loop (no
messages kept, so thousands of loops fit in memory): its state, model, turns, tokens, plus the
console's own last activity, inputs, the stream sequence of every record (for paging the timeline),
fork points and gates with their texts. :func:`select` filters and pages a list of summaries;
:func:`cut_strings` shortens large strings in an event for the browser; :func:`same_origin`
and :func:`token_ok` are the request checks.
"""

from __future__ import annotations

import hmac
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from shared.content import text_of
from shared.events import (
    Budget,
    Event,
    GateOpened,
    GateResolved,
    InputSubmitted,
    ParentRef,
    PermissionRequested,
    UserInputRequested,
)
from shared.forking import ForkPoints
from shared.history import LoopHistory
from shared.loopstate import STATES, LoopState, loop_state
from shared.modelspec import model_id
from shared.pricing import usd

PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 500
# Strings longer than this are cut before an event is sent to the page (the page can ask for the whole event).
CUT_CHARS: Final = 2000
TITLE_CHARS: Final = 120
RECENT_GATES: Final = 100


@dataclass(slots=True)
class GateView:
    gate_id: str
    loop_id: str
    turn_id: str
    kind: str = ""
    tool_name: str = ""
    controls: list[str] = field(default_factory=list)
    text: str = ""  # the permission summary or the question
    choices: list[str] = field(default_factory=list)
    opened_at: str = ""
    opened_seq: int = 0
    # Set once resolved: who answered, how and when.
    action: str = ""
    resolver: str = ""
    reason: str = ""
    resolved_at: str = ""
    resolved_seq: int = 0
    child_of: str = ""  # a sub-agent's child loop's gate: the parent loop whose inbox shows it

    @property
    def resolved(self) -> bool:
        return bool(self.action)


@dataclass(slots=True)
class LoopSummary:
    """The console's view of one loop: a lean :class:`LoopHistory` (state, model, turns, tokens, cost,
    budget, lineage) plus what only the console shows. Feed every committed record in order with :meth:`apply`."""

    loop_id: str
    last_activity: str = ""
    title: str = ""  # the first input, for people and for the text filter
    last_input: str = ""
    seqs: list[int] = field(default_factory=list)
    fork_points: ForkPoints = field(default_factory=ForkPoints)
    gates: dict[str, GateView] = field(default_factory=dict)
    fold: LoopHistory = field(init=False)
    # Gate texts arrive in PermissionRequested / UserInputRequested, in the same commit as GateOpened.
    _texts: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fold = LoopHistory(loop_id=self.loop_id, lean=True)

    def apply(self, event: Event, seq: int) -> bool:
        """Fold one committed record; False (nothing changed) for one at or below ``last_seq``."""
        if seq <= self.fold.last_seq:
            return False
        self.fold.apply(event, seq)
        self.seqs.append(seq)
        self.fork_points.add(seq, event)
        if event.created_at:
            self.last_activity = event.created_at
        if isinstance(event, InputSubmitted):
            self.last_input = _title(text_of(event.message))
            if not self.title:
                self.title = self.last_input
        elif isinstance(event, PermissionRequested):
            self._gate_text(event.request.gate_id, event.request.summary, [])
        elif isinstance(event, UserInputRequested):
            self._gate_text(event.gate_id, event.question, list(event.choices))
        elif isinstance(event, GateOpened):
            g = event.gate
            text, choices = self._texts.pop(g.id, ("", []))
            self.gates[g.id] = GateView(
                gate_id=g.id,
                loop_id=self.loop_id,
                turn_id=event.turn_id,
                kind=g.kind,
                tool_name=g.tool_name,
                controls=list(g.controls),
                text=text,
                choices=choices,
                opened_at=event.created_at,
                opened_seq=seq,
                child_of=self.agent_parent,
            )
        elif isinstance(event, GateResolved):
            gv = self.gates.get(event.gate_id)
            if gv is not None and not gv.resolved:
                gv.action = event.action
                gv.resolver = event.resolver
                gv.reason = event.reason or event.text
                gv.resolved_at = event.created_at
                gv.resolved_seq = seq
        return True

    def _gate_text(self, gate_id: str, text: str, choices: list[str]) -> None:
        gv = self.gates.get(gate_id)
        if gv is None:
            self._texts[gate_id] = (text, choices)
        else:
            gv.text, gv.choices = text, choices

    # --- from the fold

    @property
    def state(self) -> LoopState:
        return loop_state(self.fold)

    @property
    def open_gates(self) -> list[GateView]:
        """Unanswered gates of the running turn (a gate of an ended turn can no longer be answered)."""
        return [self.gates[g.gate.id] for g in self.fold.open_gates if g.gate.id in self.gates]

    @property
    def open_turn(self) -> str:
        """The running turn's id ("" when none)."""
        t = self.fold.open_turn
        return t.turn_id if t is not None else ""

    @property
    def last_seq(self) -> int:
        return self.fold.last_seq

    @property
    def closed(self) -> bool:
        return self.fold.closed

    @property
    def turns(self) -> int:
        return self.fold.turns

    @property
    def pending_inputs(self) -> int:
        return len(self.fold.pending_inputs)

    @property
    def model(self) -> str:
        c = self.fold.config
        return model_id(c.model) if c is not None else ""  # a scripted model by its file, not a temporary path

    @property
    def started_at(self) -> str:
        c = self.fold.config
        return c.created_at if c is not None else ""

    @property
    def last_outcome(self) -> str:
        """done | failed | interrupted of the last ended turn ("" before any)."""
        return self.fold.last_outcome or ""

    @property
    def last_error(self) -> str:
        e = self.fold.last_error
        return f"{e.kind}: {e.message}" if e is not None else ""

    @property
    def input_tokens(self) -> int:
        return self.fold.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.fold.usage.output_tokens

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_micro_usd(self) -> int:
        """The steps' and compactions' recorded costs (docs/budgets.md)."""
        return self.fold.cost_micro_usd

    @property
    def budget(self) -> Budget:
        """As set by LoopStarted or the latest BudgetChanged (not extended by approved budget gates)."""
        return self.fold.budget_base

    @property
    def parent(self) -> str:
        """A fork's source loop ("" for a loop that was started)."""
        f = self.fold.forked
        return f.source_loop_id if f is not None else ""

    @property
    def forked_at(self) -> int:
        """The source's sequence a fork was forked at."""
        f = self.fold.forked
        return f.source_seq if f is not None else 0

    @property
    def _agent(self) -> ParentRef | None:
        """A sub-agent's child loop: the parent loop, the agent tool and the parent's call it runs for."""
        c = self.fold.config
        return c.parent if c is not None else None

    @property
    def agent_parent(self) -> str:
        a = self._agent
        return a.loop_id if a is not None else ""

    @property
    def agent_tool(self) -> str:
        a = self._agent
        return a.tool_name if a is not None else ""

    @property
    def agent_call(self) -> str:
        a = self._agent
        return a.tool_execution_id if a is not None else ""

    def seqs_before(self, before: int, limit: int) -> list[int]:
        """Up to ``limit`` record sequences below ``before`` (0: the tail), oldest first."""
        end = len(self.seqs) if before <= 0 else bisect_left(self.seqs, before)
        return self.seqs[max(0, end - limit) : end]

    def to_json(self) -> dict[str, Any]:
        return {
            "loop_id": self.loop_id,
            "state": self.state,
            "model": self.model,
            "title": self.title,
            "last_input": self.last_input,
            "turns": self.turns,
            "started_at": self.started_at,
            "last_activity": self.last_activity,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
            "cost_usd": usd(self.cost_micro_usd),
            "budget": msgspec.to_builtins(self.budget),
            "events": len(self.seqs),
            "last_seq": self.last_seq,
            "last_error": self.last_error,
            "parent": self.parent,
            "forked_at": self.forked_at,
            "agent_parent": self.agent_parent,
            "agent_tool": self.agent_tool,
            "agent_call": self.agent_call,
            "open_gates": [gate_json(g) for g in self.open_gates],
            "resolved_gates": [gate_json(g) for g in resolved_gates([self], RECENT_GATES)],
        }


def _title(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= TITLE_CHARS else flat[: TITLE_CHARS - 1] + "…"


def gate_json(g: GateView) -> dict[str, Any]:
    return {
        "gate_id": g.gate_id,
        "loop_id": g.loop_id,
        "child_of": g.child_of,
        "kind": g.kind,
        "tool_name": g.tool_name,
        "controls": g.controls,
        "text": g.text,
        "choices": g.choices,
        "opened_at": g.opened_at,
        "opened_seq": g.opened_seq,
        "action": g.action,
        "resolver": g.resolver,
        "resolved_at": g.resolved_at,
        "note": already_answered(g) if g.resolved else "",
    }


def already_answered(g: GateView) -> str:
    """The sentence a second operator reads when the gate was answered first by someone else."""
    if not g.resolved:
        return f"gate {g.gate_id} is no longer open (its turn ended)"
    by = g.resolver or "someone"
    if g.action == "abandoned":
        return f"gate {g.gate_id} was abandoned ({by}) at {g.resolved_at}"
    return f"gate {g.gate_id} was already answered: {g.action} by {by} at {g.resolved_at}"


# --- listing --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    items: list[LoopSummary]
    total: int  # matching loops
    page: int
    pages: int


def matches(s: LoopSummary, state: str, text: str) -> bool:
    if state and s.state != state:
        return False
    if text:
        needle = text.casefold()
        return any(needle in v.casefold() for v in (s.loop_id, s.model, s.title, s.last_input))
    return True


def select(loops: list[LoopSummary], *, state: str = "", text: str = "", page: int = 1, size: int = PAGE_SIZE) -> Page:
    """Loops matching ``state`` and ``text`` (any of id, model, inputs), most recently active first, paged."""
    found = [s for s in loops if matches(s, state, text.strip())]
    found.sort(key=lambda s: (s.last_activity, s.last_seq), reverse=True)
    size = max(1, min(size, MAX_PAGE_SIZE))
    pages = max(1, -(-len(found) // size))
    page = max(1, min(page, pages))
    return Page(items=found[(page - 1) * size : page * size], total=len(found), page=page, pages=pages)


def open_gates(loops: list[LoopSummary]) -> list[GateView]:
    """Every open gate across loops, newest first."""
    gates = [g for s in loops for g in s.open_gates]
    gates.sort(key=lambda g: g.opened_seq, reverse=True)
    return gates


def resolved_gates(loops: list[LoopSummary], limit: int = RECENT_GATES) -> list[GateView]:
    """The most recently answered gates across loops (a page shows who took a gate it still displays)."""
    gates = [g for s in loops for g in s.gates.values() if g.resolved]
    gates.sort(key=lambda g: g.resolved_seq, reverse=True)
    return gates[:limit]


def count_states(loops: list[LoopSummary]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(STATES, 0)
    for s in loops:
        counts[s.state] += 1
    return counts


# --- shaping events for the page ----------------------------------------------------------------


def cut_strings(value: Any, limit: int = CUT_CHARS) -> tuple[Any, bool]:
    """``value`` (decoded JSON) with every string longer than ``limit`` cut; True when anything was cut."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value, False
        return f"{value[:limit]}… [{len(value) - limit} more characters]", True
    if isinstance(value, list):
        out_list = []
        cut = False
        for v in value:
            nv, c = cut_strings(v, limit)
            out_list.append(nv)
            cut = cut or c
        return out_list, cut
    if isinstance(value, dict):
        out_dict = {}
        cut = False
        for k, v in value.items():
            nv, c = cut_strings(v, limit)
            out_dict[k] = nv
            cut = cut or c
        return out_dict, cut
    return value, False


# --- request checks -------------------------------------------------------------------------------

LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def same_origin(origin: str | None, host: str | None, fetch_site: str | None = None) -> bool:
    """May a state-changing request with these headers be served? Cross-site ones are refused.

    ``Origin`` must name the host the request was sent to; without an ``Origin`` (curl, scripts)
    the request is allowed unless the browser says it is cross-site (``Sec-Fetch-Site``).
    """
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    if origin is None:
        return True
    if not host:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def host_of(host_header: str | None) -> str:
    """The host name of a ``Host`` header (``127.0.0.1:8080`` → ``127.0.0.1``, ``[::1]:80`` → ``::1``)."""
    if not host_header:
        return ""
    return urlsplit(f"//{host_header}").hostname or ""


def host_allowed(host_header: str | None, token: str) -> bool:
    """Without a token only loopback names are served: a page of another site whose name was made to
    resolve to 127.0.0.1 (DNS rebinding) must not read or steer loops."""
    return bool(token) or is_loopback(host_of(host_header))


def token_ok(expected: str, given: str | None) -> bool:
    """True when no token is configured, or ``given`` equals it (compared in constant time)."""
    if not expected:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
