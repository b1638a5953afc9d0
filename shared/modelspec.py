"""A model spec (``demo``, ``scripted:<path>``, ``openai:<model>``, ``anthropic:<model>``): its form,
and the name it goes by in spans, metrics, logs, the CLI and the console. Resolving one to a model
is the model-step's (``services.model_step.models``)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Final

MODEL_SPECS: Final = ("demo", "scripted:<path>", "openai:<model>", "anthropic:<model>")


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
