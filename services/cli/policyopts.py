"""The tool options of ``start`` and ``fork``: --policy TOOL=EFFECT and --retry TOOL=N[:INITIAL[:MAX]]."""

from __future__ import annotations

from services.cli.errors import CliError
from services.model_step.policy import parse_policy as policy_rules
from services.toolwire.spec import valid_tool_name
from shared.events import RetryPolicy
from shared.wiretypes import PolicyEffect


def parse_policy(items: list[str]) -> dict[str, PolicyEffect]:
    try:
        return policy_rules(items)
    except ValueError as e:
        raise CliError(f"--policy wants {e}") from None


def parse_retries(items: list[str]) -> dict[str, RetryPolicy]:
    """``TOOL=N[:INITIAL[:MAX]]`` → per-tool retry policies (attempts, backoff seconds)."""
    out: dict[str, RetryPolicy] = {}
    for item in items:
        tool_name, sep, spec = item.partition("=")
        parts = spec.split(":")
        try:
            if not sep or not valid_tool_name(tool_name) or not 1 <= len(parts) <= 3:
                raise ValueError
            attempts = int(parts[0])
            initial = float(parts[1]) if len(parts) > 1 else RetryPolicy().initial_backoff_seconds
            biggest = float(parts[2]) if len(parts) > 2 else max(initial, RetryPolicy().max_backoff_seconds)
            if not 1 <= attempts <= 100 or not 0 <= initial <= biggest <= 3600:
                raise ValueError
        except ValueError:
            raise CliError(
                f"--retry wants TOOL=N[:INITIAL[:MAX]] (1 ≤ N ≤ 100, 0 ≤ INITIAL ≤ MAX ≤ 3600 s), got {item!r}"
            ) from None
        out[tool_name] = RetryPolicy(
            max_attempts=attempts, initial_backoff_seconds=initial, max_backoff_seconds=biggest
        )
    return out
