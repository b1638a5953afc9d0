"""What each sub-command runs: :class:`ClientCommand` for the commands that connect, a function for the others.

The services and the tool SDK are imported inside the handler that runs them, so the client commands
start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shared.settings import Settings, split_list

AsyncCommand = Callable[[argparse.Namespace, Settings], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class ClientCommand:
    """A handler that connects: ``fn`` runs with the settings of the command line and environment."""

    fn: AsyncCommand

    def __call__(self, args: argparse.Namespace) -> int:
        import anyio

        from services.cli import historycmds

        settings = settings_from(args)
        try:
            return anyio.run(self._with_deployment, args, settings)
        except KeyboardInterrupt:
            if self.fn is historycmds.cmd_tail:
                return 0  # Ctrl-C is how tail ends
            raise

    async def _with_deployment(self, args: argparse.Namespace, settings: Settings) -> int:
        from services.cli.session import deployment_settings

        return await self.fn(args, await deployment_settings(settings))


def settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    url = getattr(args, "nats_url", None)
    if url:
        overrides["nats_urls"] = split_list(url)
    prefix = getattr(args, "prefix", None)
    if prefix:
        overrides["prefix"] = prefix
    from services.cli.errors import CliError

    try:
        return Settings.from_env(None, **overrides)
    except ValueError as e:  # a bad LW_* value
        raise CliError(str(e)) from None


def handle_demo(args: argparse.Namespace) -> int:
    from services.cli import stack

    return stack.run_demo(args)


def handle_up(args: argparse.Namespace) -> int:
    from services.cli import stack

    return stack.run_up(args)


def handle_serve(args: argparse.Namespace) -> int:
    from services.cli import serve

    return serve.run_serve(args, settings_from(args))


def handle_console(args: argparse.Namespace) -> int:
    from services.cli import serve

    return serve.run_console(args, settings_from(args))


def handle_schema(args: argparse.Namespace) -> int:
    from pathlib import Path

    from services.cli.errors import CliError
    from services.contract import files, schemas
    from services.contract.asyncapi import render_asyncapi

    if not args.out and not args.asyncapi:
        if args.check:
            raise CliError("--check needs --out and/or --asyncapi")
        print(schemas.dumps_json({k: v for k, v in schemas.schema_files().items()}), end="")
        return 0
    if args.check:
        problems = []
        if args.out:
            problems += files.schema_drift(Path(args.out))
        if args.asyncapi:
            problems += files.asyncapi_drift(Path(args.asyncapi))
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            raise CliError("the contract files differ from the code: run loopwire schema without --check")
        print("contract files match the code")
        return 0
    if args.out:
        written = files.write_schemas(Path(args.out))
        print(f"wrote {len(written)} files under {args.out}")
    if args.asyncapi:
        path = Path(args.asyncapi)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_asyncapi(), encoding="utf-8")
        print(f"wrote {path}")
    return 0


def handle_auth_config(args: argparse.Namespace) -> int:
    from services.authconf import auth_config
    from services.cli.errors import CliError
    from shared.settings import MAX_SHARDS

    if not 1 <= args.shards <= MAX_SHARDS:
        raise CliError(f"--shards must be 1-{MAX_SHARDS}, got {args.shards}")
    sys.stdout.write(auth_config(args.shards, args.prefix))
    return 0
