"""The verify command: re-read histories and check every record against its loop's digest chain."""

from __future__ import annotations

import argparse

from services.cli.errors import CliError
from services.cli.ids import loop_ref, resolve_loop
from services.cli.output import out
from services.cli.render import json_line
from services.cli.session import session
from shared.settings import Settings
from shared.verify import Report, verify_all, verify_loop


def _summary_line(report: Report) -> str:
    s = report.summary()
    read = f"{s['streams']} stream(s), {s['loops']} loop(s), {s['records']} record(s)"
    unchained = f"; {s['unchained']} record(s) unchained (written before digests)" if s["unchained"] else ""
    if s["ok"]:
        return f"ok: {read} verified, no problems{unchained}"
    kinds = ", ".join(f"{n} {k}" for k, n in s["by_kind"].items())
    return f"FAILED: {read} read, {s['problems']} problem(s) ({kinds}){unchained}"


async def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    if args.all == (args.loop is not None):
        raise CliError("give LOOP or --all (not both)")
    ref = loop_ref(args.loop, "LOOP") if args.loop is not None else ""
    async with session(settings) as nc:
        if args.all:
            report = await verify_all(nc, settings.names)
        else:
            loop_id = await resolve_loop(nc, settings, ref)
            report = await verify_loop(nc, settings.names, loop_id)
            if loop_id not in report.loops and report.ok:
                raise CliError(f"no loop {loop_id}")
    unchained = [c for c in report.loops.values() if c.unchained]
    if args.json:
        for p in report.problems:
            out(json_line(p.to_json()))
        for c in unchained:
            out(
                json_line(
                    {
                        "unchained": c.unchained,
                        "loop_id": c.loop_id,
                        "stream": c.stream,
                        "through_seq": c.unchained_last_seq,
                    }
                )
            )
        out(json_line({"summary": report.summary()}))
    else:
        for p in report.problems:
            out(p.line())
        for c in unchained:
            out(
                f"{'unchained':<8} loop {c.loop_id}: {c.unchained} record(s) through seq "
                f"{c.unchained_last_seq} written before digests (not checked; the chain starts after them)"
            )
        out(_summary_line(report))
    return 0 if report.ok else 1
