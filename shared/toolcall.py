"""One tool call of a model reply, checked once: what the model-step authorises and the executor runs.

A :class:`ToolCall` is made from the bytes the model sent (:func:`shared.shaping.sanitize_step`) or
from the recorded wire view of a step continued later (:meth:`ToolCall.of`). Whether its arguments
are strict JSON is decided there, once; the driver, the policy and the executor read ``invalid``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.events import RawToolUse
from shared.strictjson import EMBEDDED_MAX_DEPTH, why_not_strict


def strict_error(data: bytes | str) -> str:
    """Why ``data`` is not strict JSON that can be embedded in a record; "" when it is."""
    return why_not_strict(data, max_depth=EMBEDDED_MAX_DEPTH)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool use as the model made it, with the verdict on its arguments."""

    id: str
    name: str
    input: str  # the arguments as text (the wire view's ``RawToolUse.input``)
    data: bytes  # the same arguments as sent to the tool's worker
    invalid: str = ""  # why the arguments are not strict JSON; "" = they are
    minted_id: bool = False  # the id was missing or repeated and one was minted: the call never runs

    @classmethod
    def of(cls, use: RawToolUse) -> ToolCall:
        """The call of a recorded wire view (a step continued from its plan or a gate)."""
        return cls(
            id=use.id,
            name=use.name,
            input=use.input,
            data=use.input.encode("utf-8", "surrogatepass"),
            invalid=strict_error(use.input),
            minted_id=use.minted_id,
        )

    def raw(self) -> RawToolUse:
        """The wire view (stored in a step's plan and in a gate)."""
        return RawToolUse(id=self.id, name=self.name, input=self.input, minted_id=self.minted_id)


__all__ = ["ToolCall", "strict_error"]
