"""What the commands read from a loop's history: its fold, its open gates with their texts, its state."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.client import Client as NATS

from services.cli.budgets import budget_gate_text
from shared.events import PermissionRequested, UserInputRequested
from shared.history import LoopHistory
from shared.loopstate import describe
from shared.replay import replay
from shared.subjects import Names


@dataclass
class GateInfo:
    loop_id: str
    gate_id: str
    kind: str
    tool_name: str
    text: str = ""
    choices: list[str] = field(default_factory=list)
    opened_seq: int = 0
    parent: str = ""  # a sub-agent's child loop: the parent loop it runs for


async def fold_loop(nc: NATS, names: Names, loop_id: str) -> tuple[LoopHistory, dict[str, tuple[str, list[str]]]]:
    """The fold of a loop plus, per gate id, its summary/question and choices."""
    h = LoopHistory(loop_id=loop_id)
    texts: dict[str, tuple[str, list[str]]] = {}
    async for seq, e in replay(nc, loop_id, names=names):
        h.apply(e, seq)
        if isinstance(e, PermissionRequested):
            texts[e.request.gate_id] = (e.request.summary, [])
        elif isinstance(e, UserInputRequested):
            texts[e.gate_id] = (e.question, list(e.choices))
    return h, texts


def gates_of(h: LoopHistory, texts: dict[str, tuple[str, list[str]]]) -> list[GateInfo]:
    out_: list[GateInfo] = []
    for g in h.open_gates:
        text, choices = texts.get(g.gate.id, ("", []))
        if g.gate.kind == "budget":
            text = budget_gate_text(h)
        out_.append(
            GateInfo(
                loop_id=h.loop_id,
                gate_id=g.gate.id,
                kind=g.gate.kind,
                tool_name=g.gate.tool_name,
                text=text,
                choices=choices,
                opened_seq=g.opened_seq,
                parent=h.config.parent.loop_id if h.config is not None and h.config.parent is not None else "",
            )
        )
    return out_


def loop_state(h: LoopHistory) -> str:
    """The loop's state as the CLI prints it (the one vocabulary, :mod:`shared.loopstate`)."""
    return describe(h)
