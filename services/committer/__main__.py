"""``python -m services.committer``: run one committer (any number may run; they share the work)."""

from __future__ import annotations

import argparse
import sys

from services.runner import env_settings, run_service
from shared.settings import split_list

from .service import CommitterService


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.committer",
        description="Serve the commit protocol and the loop API; the only writer of loop history. "
        "Configuration comes from LW_* environment variables; the options below override them.",
    )
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated (LW_NATS_URL)")
    parser.add_argument("--prefix", help="subject/stream prefix (LW_PREFIX)")
    parser.add_argument("--replicas", type=int, choices=(1, 3), help="stream and bucket replicas (LW_REPLICAS)")
    parser.add_argument("--log-level", help="log level (LW_LOG_LEVEL)")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {}
    if args.nats_url:
        overrides["nats_urls"] = split_list(args.nats_url)
    if args.prefix:
        overrides["prefix"] = args.prefix
    if args.replicas:
        overrides["replicas"] = args.replicas
    if args.log_level:
        overrides["log_level"] = args.log_level
    settings = env_settings(**overrides)
    return run_service("committer", CommitterService, settings)


if __name__ == "__main__":
    sys.exit(main())
