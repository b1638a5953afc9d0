"""A model spec (``demo``, ``scripted:<path>``, ``openai:<model>``, ``anthropic:<model>``): its form,
and the name it goes by in spans, metrics, logs, the CLI and the console. Resolving one to a model
is the model-step's (``services.model_step.models``)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Final

MODEL_SPECS: Final = ("demo", "scripted:<path>", "openai:<model>", "anthropic:<model>")

# Context windows in tokens (input and output together), by provider model name prefix: the longest
# prefix that matches wins. A model not listed gets its provider's default, then DEFAULT_WINDOW.
CONTEXT_WINDOWS: Final[dict[str, int]] = {
    "openai:gpt-4o": 128_000,
    "openai:gpt-4o-mini": 128_000,
    "openai:gpt-4.1": 1_047_576,
    "openai:gpt-4-turbo": 128_000,
    "openai:gpt-4": 8_192,
    "openai:gpt-3.5-turbo": 16_385,
    "openai:gpt-5": 400_000,
    "openai:o1": 200_000,
    "openai:o3": 200_000,
    "openai:o4-mini": 200_000,
    "anthropic:claude-3": 200_000,
    "anthropic:claude-3-5": 200_000,
    "anthropic:claude-3-7": 200_000,
    "anthropic:claude-sonnet-4": 200_000,
    "anthropic:claude-opus-4": 200_000,
    "anthropic:claude-haiku-4": 200_000,
}
PROVIDER_WINDOWS: Final[dict[str, int]] = {"openai": 128_000, "anthropic": 200_000}
# demo, scripted and unknown providers: a window small enough to be safe for most models served
# through an OpenAI-compatible endpoint.
DEFAULT_WINDOW: Final = 128_000


def context_window(spec: str) -> int:
    """The context window of ``spec`` in tokens (a loop's ContextPolicy.window overrides it)."""
    spec = spec.strip()
    best = ""
    for prefix in CONTEXT_WINDOWS:
        if spec.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    if best:
        return CONTEXT_WINDOWS[best]
    return PROVIDER_WINDOWS.get(spec.partition(":")[0], DEFAULT_WINDOW)


def spec_problem(spec: str) -> str:
    """What is wrong with a model spec's form ("" when nothing): checked where a loop is started, so
    a typo is an error there, not a turn that fails later. Whether the provider answers is not."""
    kind, sep, rest = spec.strip().partition(":")
    if spec.strip() == "demo" or (sep and kind in ("scripted", "openai", "anthropic") and rest.strip()):
        return ""
    shown = spec if len(spec) <= 80 else spec[:80] + "…"
    return f"unknown model {shown!r}: expected one of {', '.join(MODEL_SPECS)}"


def model_id(spec: str) -> str:
    """How spans, metrics and logs name the model of ``spec``: the spec itself, but a scripted model by
    its file's name (``scripted:s.json``): a path says where a test kept its script, not which
    model answered, and would give every temporary directory a metric series of its own."""
    kind, sep, rest = spec.strip().partition(":")
    if sep and kind == "scripted" and rest:
        return f"scripted:{PurePath(rest).name}"
    return spec
