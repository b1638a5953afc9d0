"""python -m services.model_step — one model-step replica (configuration from LW_* variables)."""

from __future__ import annotations

import argparse
import sys

from services.runner import env_settings, run_service
from shared.settings import ENV_VARS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.model_step",
        description="Drive agent loops: pull LW_WORK, lease a loop, stream the model, run tools, commit steps.",
        epilog="environment: "
        + ", ".join(k for k in ENV_VARS if k.startswith(("LW_NATS", "LW_PREFIX", "LW_MODEL", "LW_LEASE"))),
    )
    parser.parse_args(argv)
    from services.model_step.service import ModelStepService

    settings = env_settings()
    return run_service("model-step", ModelStepService, settings)


if __name__ == "__main__":
    sys.exit(main())
