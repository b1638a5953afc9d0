"""What a model's tokens cost: USD per million input, output, cache-read and cache-write tokens.

The table is the providers' published list prices (docs/budgets.md names the sources and the
date); ``demo`` and every ``scripted:`` model have a made-up price so tests can spend a cost budget.
A step's cost is computed once, when the model-step commits the step (``StepDone.cost_micro_usd``):
changing this table never changes what a recorded step cost.

USD per million tokens times tokens is micro-USD, so a step's cost is an exact integer sum of
``tokens × price`` (rounded up to the next micro-USD).
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from shared.content import Usage

__all__ = ["PRICES", "Price", "price_of", "step_cost_micro_usd", "usd", "usd_to_micro"]


class Price(msgspec.Struct, frozen=True, kw_only=True):
    """USD per million tokens. ``input`` is the uncached input; cache reads and writes are priced apart."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


# The price of the demo and scripted models: round figures a test can compute by hand.
TEST_PRICE: Final = Price(input=1.0, output=2.0, cache_read=0.1, cache_write=1.25)

# Keyed by the model name after the provider prefix ("openai:gpt-4o" → "gpt-4o"). A dated model
# name ("gpt-4o-2024-08-06", "claude-sonnet-4-20250514") is priced as its longest listed prefix.
PRICES: Final[dict[str, Price]] = {
    # OpenAI (https://openai.com/api/pricing/)
    "gpt-4o": Price(input=2.50, output=10.00, cache_read=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cache_read=0.075),
    "gpt-4.1": Price(input=2.00, output=8.00, cache_read=0.50),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cache_read=0.10),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cache_read=0.025),
    "o3": Price(input=2.00, output=8.00, cache_read=0.50),
    "o3-mini": Price(input=1.10, output=4.40, cache_read=0.55),
    "o4-mini": Price(input=1.10, output=4.40, cache_read=0.275),
    "gpt-5": Price(input=1.25, output=10.00, cache_read=0.125),
    "gpt-5-mini": Price(input=0.25, output=2.00, cache_read=0.025),
    "gpt-5-nano": Price(input=0.05, output=0.40, cache_read=0.005),
    # Anthropic (https://www.anthropic.com/pricing#api); cache writes at the 5-minute rate
    "claude-opus-4": Price(input=15.00, output=75.00, cache_read=1.50, cache_write=18.75),
    "claude-opus-4-1": Price(input=15.00, output=75.00, cache_read=1.50, cache_write=18.75),
    "claude-sonnet-4": Price(input=3.00, output=15.00, cache_read=0.30, cache_write=3.75),
    "claude-sonnet-4-5": Price(input=3.00, output=15.00, cache_read=0.30, cache_write=3.75),
    "claude-3-7-sonnet": Price(input=3.00, output=15.00, cache_read=0.30, cache_write=3.75),
    "claude-3-5-sonnet": Price(input=3.00, output=15.00, cache_read=0.30, cache_write=3.75),
    "claude-3-5-haiku": Price(input=0.80, output=4.00, cache_read=0.08, cache_write=1.00),
    "claude-haiku-4-5": Price(input=1.00, output=5.00, cache_read=0.10, cache_write=1.25),
}


def price_of(spec: str) -> Price | None:
    """The price of a model spec (``demo``, ``scripted:<path>``, ``openai:<model>``...), None when unlisted."""
    kind, sep, rest = spec.strip().partition(":")
    if spec.strip() == "demo" or (sep and kind == "scripted"):
        return TEST_PRICE
    name = rest.strip() if sep else spec.strip()
    if name.endswith("-latest"):
        name = name[: -len("-latest")]
    best = ""
    for key in PRICES:
        if (name == key or name.startswith(key + "-")) and len(key) > len(best):
            best = key
    return PRICES[best] if best else None


def step_cost_micro_usd(price: Price | None, usage: Usage | None) -> int:
    """The cost of one step's usage in micro-USD (0 without a price or usage), rounded up."""
    if price is None or usage is None:
        return 0
    total = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_creation_tokens * price.cache_write
    )
    # (a float sum of exact decimal prices can land a hair above an integer: round that back first)
    return math.ceil(round(total, 6))


def usd_to_micro(value: float) -> int:
    """A USD amount (a budget's max_cost_usd) in whole micro-USD."""
    return round(value * 1_000_000)


def usd(micro: int) -> float:
    """Micro-USD as USD."""
    return micro / 1_000_000
