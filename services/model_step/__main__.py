"""python -m services.model_step — one model-step replica (configuration from LW_* variables)."""

from __future__ import annotations

import argparse
import sys

import anyio

from services.runner import run_service
from shared.settings import ENV_VARS, Settings


async def _serve(settings: Settings, stop: anyio.Event, ready: anyio.Event) -> None:
    from services.model_step.service import serve

    await serve(settings, stop=stop, ready=ready)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.model_step",
        description="Drive agent loops: pull LW_WORK, lease a loop, stream the model, run tools, commit steps.",
        epilog="environment: "
        + ", ".join(k for k in ENV_VARS if k.startswith(("LW_NATS", "LW_PREFIX", "LW_MODEL", "LW_LEASE"))),
    )
    parser.parse_args(argv)
    return run_service("model-step", _serve)


if __name__ == "__main__":
    sys.exit(main())
