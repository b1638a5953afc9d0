"""The gate commands: gates (the list of open ones), approve, deny and reply."""

from __future__ import annotations

import argparse

from nats.aio.client import Client as NATS
from rich.table import Table

from services.cli.errors import CliError
from services.cli.folds import GateInfo, fold_loop, gates_of
from services.cli.ids import gate_ref, loop_ref, pick, require_known_loop, resolve_loop
from services.cli.output import cells, make_console, out
from services.cli.render import json_line, short
from services.cli.session import session
from shared.client import LoopClient
from shared.forking import descendants, origins
from shared.replay import loops
from shared.settings import Settings
from shared.subjects import Names
from shared.validate import is_uuid
from shared.wiretypes import AnswerAction


def _pick_gate(ref: str, open_: dict[str, str], other: dict[str, str]) -> tuple[str, str]:
    """(loop id, gate id) of the gate ``ref`` names among gates mapped to their loops: an open gate
    first (tables list open ones), else a closed one (the committer then says it is no longer open)."""
    pool = open_ if any(g.startswith(ref) for g in open_) else other
    gate_id = pick(ref, pool, "GATE", "gate", "loopwire gates")
    return pool[gate_id], gate_id


async def find_gate(nc: NATS, names: Names, ref: str) -> tuple[str, str]:
    """(loop id, gate id) of the gate ``ref`` (a whole id or a unique prefix of one) names, by scanning loops."""
    open_: dict[str, str] = {}
    other: dict[str, str] = {}
    for loop_id in await loops(nc, names):
        h, _ = await fold_loop(nc, names, loop_id)
        for gate_id in h.gates:
            if gate_id.startswith(ref):
                (open_ if h.gate_is_open(gate_id) else other)[gate_id] = loop_id
    if not open_ and not other and is_uuid(ref):
        raise CliError(f"no loop has a gate {ref} (give --loop if it is new)")
    return _pick_gate(ref, open_, other)


async def find_gate_in(nc: NATS, names: Names, loop_id: str, ref: str) -> str:
    """The gate id of ``loop_id`` that ``ref`` names (a whole id goes to the committer as it is)."""
    if is_uuid(ref):
        return ref
    h, _ = await fold_loop(nc, names, loop_id)
    open_ = {g: loop_id for g in h.gates if h.gate_is_open(g)}
    return _pick_gate(ref, open_, {g: loop_id for g in h.gates})[1]


async def cmd_gates(args: argparse.Namespace, settings: Settings) -> int:
    found: list[GateInfo] = []
    async with session(settings) as nc:
        if args.loop:
            target = await resolve_loop(nc, settings, loop_ref(args.loop, "LOOP"))
            await require_known_loop(nc, settings, target)  # not "no open gates" for a loop that is not there
            # A sub-agent's gates wait in its parent's inbox: the loop's child loops are listed too.
            ids = [target, *descendants(await origins(nc, settings.names, await loops(nc, settings.names)), target)]
        else:
            ids = await loops(nc, settings.names)
        for loop_id in ids:
            h, texts = await fold_loop(nc, settings.names, loop_id)
            found.extend(gates_of(h, texts))
    if args.json:
        for g in found:
            out(
                json_line(
                    {
                        "gate_id": g.gate_id,
                        "loop_id": g.loop_id,
                        "kind": g.kind,
                        "tool": g.tool_name,
                        "text": g.text,
                        "choices": g.choices,
                        "opened_seq": g.opened_seq,
                        "parent": g.parent or None,
                    }
                )
            )
        return 0
    if not found:
        out("no open gates")
        return 0
    table = Table()
    for col in ("gate", "loop", "kind", "tool", "summary / question"):
        table.add_column(col, no_wrap=col in ("gate", "loop", "kind"), overflow="fold")
    for g in found:
        text = g.text + (f"  [{', '.join(g.choices)}]" if g.choices else "")
        where = short(g.loop_id) + (f" (child of {short(g.parent)})" if g.parent else "")
        table.add_row(*cells(g.gate_id, where, g.kind, g.tool_name, text))
    make_console().print(table)
    return 0


async def _answer(
    args: argparse.Namespace, settings: Settings, action: AnswerAction, *, text: str = "", reason: str = ""
) -> int:
    ref = gate_ref(args.gate)
    async with session(settings) as nc:
        names = settings.names
        if args.loop:
            loop_id = await resolve_loop(nc, settings, loop_ref(args.loop, "--loop"), "--loop")
            gate_id = await find_gate_in(nc, names, loop_id, ref)
        else:
            loop_id, gate_id = await find_gate(nc, names, ref)
        res = await LoopClient(nc, names).answer(loop_id, gate_id, action, text=text, reason=reason)
    if args.json:
        out(json_line({"loop_id": loop_id, "gate_id": gate_id, "action": action, "seq": res.seq}))
    else:
        out(f"gate {gate_id} of loop {loop_id}: {action} (seq {res.seq})")
    return 0


async def cmd_approve(args: argparse.Namespace, settings: Settings) -> int:
    return await _answer(args, settings, "approve_always" if args.always else "approve")


async def cmd_deny(args: argparse.Namespace, settings: Settings) -> int:
    return await _answer(args, settings, "deny", reason=args.reason or "")


async def cmd_reply(args: argparse.Namespace, settings: Settings) -> int:
    if not args.text.strip():
        raise CliError("TEXT must not be empty")
    return await _answer(args, settings, "reply", text=args.text)
