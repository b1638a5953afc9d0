"""The parsers of the commands about the deployment itself: its streams, its shards, its histories'
digest chains, its permissions and its wire contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.cli.handlers import ClientCommand, handle_auth_config, handle_schema
from services.cli.parserkit import command, json_option
from services.cli.parsing import count

if TYPE_CHECKING:
    from services.cli.parserkit import Commands


def add_streams(sub: Commands) -> None:
    from services.cli import streamscmd

    p = command(
        sub,
        "streams",
        "every shard's streams and buckets: leader, followers, messages",
        "For every shard (LW_SHARDS): its history and work streams and its leases and results buckets, each "
        "with the node that leads it, its followers and its message count. --balance first moves leaders so "
        "each node leads about as many shards as the others and a shard's four leaders sit on one node.",
    )
    p.add_argument("--balance", action="store_true", help="move leaders to spread the shards over the nodes")
    json_option(p)
    p.set_defaults(handler=ClientCommand(streamscmd.cmd_streams))


def add_verify(sub: Commands) -> None:
    from services.cli import verifycmd

    p = command(
        sub,
        "verify",
        "check stored histories against their digest chains: gaps, changed records, broken chains",
        "Re-read the history of LOOP (or, with --all, every loop of every shard's history stream) and check "
        "each record's digest chain (docs/protocol.md): one line per problem (a gap, a changed record, a "
        "broken chain, a history stream missing or unreadable), then a summary; exit 1 on any problem. "
        "Records written before digests are reported as unchained, not as problems.",
    )
    p.add_argument("loop", nargs="?", metavar="LOOP", help="loop id (or a unique start of one)")
    p.add_argument("--all", action="store_true", help="every loop of every shard")
    json_option(p)
    p.set_defaults(handler=ClientCommand(verifycmd.cmd_verify))


def add_shards(sub: Commands) -> None:
    from services.cli import shardscmd

    p = command(
        sub,
        "shards",
        "the deployment's shard count; `shards grow N` grows a one-shard deployment",
        "Every process reads the shard count from the deployment. `loopwire shards grow N` records N and "
        "creates the new shards' streams; it refuses while any service runs (docs/scaling.md).",
    )
    # `shards` and `shards grow N` are one command (a sub-command of its own would make `shards`
    # alone a command of commands, which must be given one).
    p.add_argument("action", nargs="?", choices=("grow",), metavar="grow", help="grow the deployment to N shards")
    p.add_argument("grow", nargs="?", type=count, metavar="N", help="the new shard count (with grow)")
    json_option(p)
    p.set_defaults(handler=ClientCommand(shardscmd.cmd_shards))


def add_auth_config(sub: Commands) -> None:
    p = command(
        sub,
        "auth-config",
        "print the NATS users and permissions (auth.conf) for an N-shard deployment",
        "One user per service kind (committer, model-step, each built-in tool, an MCP bridge, operator, "
        "reader), each granted every shard's subjects, streams and buckets; deploy/nats/auth.conf is its output.",
        connects=False,
    )
    p.add_argument("--shards", type=count, default=1, metavar="N", help="the deployment's shard count (default 1)")
    p.add_argument("--prefix", default="lw", help="the deployment's LW_PREFIX (default lw)")
    p.set_defaults(handler=handle_auth_config)


def add_schema(sub: Commands) -> None:
    p = command(
        sub,
        "schema",
        "write the JSON Schemas (and the AsyncAPI document) of the wire contract",
        "Without options: every JSON Schema as one JSON object on stdout. --out DIR writes one file per "
        "type; --asyncapi FILE writes the AsyncAPI 3 document; --check compares instead of writing.",
        connects=False,
    )
    p.add_argument("--out", metavar="DIR", help="write schema files here (e.g. schemas)")
    p.add_argument("--asyncapi", metavar="FILE", help="write the AsyncAPI document here (e.g. docs/asyncapi.yaml)")
    p.add_argument("--check", action="store_true", help="exit 1 if the files differ from the code")
    p.set_defaults(handler=handle_schema)
