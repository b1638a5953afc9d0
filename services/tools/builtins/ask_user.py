"""``ask_user``: a user-input tool. The model-step never sends its calls to a worker: it opens a
user-input gate with ``{"question", "choices"}`` and the operator's reply becomes the result. The
worker exists so discovery lists the tool (with its schema); called directly it explains that."""

from __future__ import annotations

import msgspec

from services.tools.sdk import ToolOutput, tool
from services.toolwire.spec import KIND_USER_INPUT


class AskUserInput(msgspec.Struct, forbid_unknown_fields=True):
    """A question for the operator, optionally with the answers to choose from."""

    question: str
    choices: list[str] = msgspec.field(default_factory=list)


@tool(
    name="ask_user",
    description="Ask the human operator a question (optionally with choices) and wait for the answer.",
    kind=KIND_USER_INPUT,
    inline=True,  # only ever answers a fixed error
)
def ask_user(args: AskUserInput) -> ToolOutput:
    return ToolOutput(
        "error: ask_user is answered by the operator through the loop's user-input gate; "
        "it cannot run on a tool worker",
        is_error=True,
    )
