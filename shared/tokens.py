"""Token counts of what a model request sends (docs/context.md).

OpenAI models are counted with their own tokenizer (``bpe_openai``: the o200k_base / cl100k_base
vocabularies ship inside the package, nothing is downloaded at run time), and so are the demo and
scripted models, which send nothing anywhere. Other models (Anthropic, whose tokenizer is not
published, and any other provider) get an estimate: o200k_base's count times ESTIMATE_MARGIN,
rounded up. No ratio of bytes to tokens is both safe and not wasteful (base64, JSON, prose and code
differ by a factor of three; docs/context.md). A tokenizer follows the text's kind; the margin covers
Anthropic's tokenizers, which make up to about a third more tokens of the same text than OpenAI's.

A message costs its content plus MESSAGE_OVERHEAD (role and framing); a tool use its name, id and
input JSON; an image IMAGE_TOKENS whatever its size (providers scale images down to about 1.15
megapixels, which Anthropic bills at about 1,600 tokens and OpenAI's high detail at 1,105 at most).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Final

from shared.content import (
    ImageBlock,
    Message,
    RefusalBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    ToolUseBlock,
)

MESSAGE_OVERHEAD: Final = 4
BLOCK_OVERHEAD: Final = 3
IMAGE_TOKENS: Final = 1_600
ESTIMATE_MARGIN: Final = 1.35
ESTIMATE: Final = "estimate"

TextCounter = Callable[[str], int]


def estimate(text: str) -> int:
    """The estimate of ``text``'s tokens (see the module docstring)."""
    return math.ceil(_encoder("o200k_base")(text) * ESTIMATE_MARGIN) if text else 0


def encoding_name(spec: str) -> str:
    """The tokenizer a model spec is counted with: an OpenAI encoding's name, or ESTIMATE."""
    kind, _, model = spec.strip().partition(":")
    if kind in ("demo", "scripted"):
        return "o200k_base"  # no provider behind them: counted as is, nothing to be safe against
    if kind != "openai" or not model:
        return ESTIMATE
    # gpt-4o, gpt-4.1, gpt-5, o1/o3/o4 and later use o200k_base; gpt-4 and gpt-3.5 cl100k_base.
    if model.startswith(("gpt-4-", "gpt-3.5")) or model == "gpt-4":
        return "cl100k_base"
    return "o200k_base"


@lru_cache(maxsize=4)
def _encoder(name: str) -> TextCounter:
    with warnings.catch_warnings():  # its loader uses a deprecated importlib.resources call
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai  # type: ignore[import-untyped]  # on first use: loading takes a moment

        enc = bpe_openai.get_encoding(name)
        enc.encode("a")  # loads the vocabulary now (lazily loaded otherwise)
    return lambda text: len(enc.encode(text)) if text else 0


def text_counter(spec: str) -> TextCounter:
    """How the text of a request to ``spec`` is counted."""
    name = encoding_name(spec)
    return estimate if name == ESTIMATE else _encoder(name)


def message_tokens(message: Message, count: TextCounter) -> int:
    """The tokens ``message`` adds to a request."""
    total = MESSAGE_OVERHEAD
    if isinstance(message, ToolResultMessage):
        total += count(message.tool_use_id)
    for b in message.blocks or ():
        total += BLOCK_OVERHEAD
        if isinstance(b, TextBlock | RefusalBlock):
            total += count(b.text)
        elif isinstance(b, ToolUseBlock):
            total += count(b.id) + count(b.name) + count(bytes(b.input).decode("utf-8", "replace"))
        elif isinstance(b, ThinkingBlock):
            total += count(b.thinking) + count(b.signature)
        elif isinstance(b, ImageBlock):
            total += IMAGE_TOKENS
    return total


__all__ = [
    "BLOCK_OVERHEAD",
    "ESTIMATE",
    "ESTIMATE_MARGIN",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "TextCounter",
    "encoding_name",
    "estimate",
    "message_tokens",
    "text_counter",
]
