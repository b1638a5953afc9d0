"""Fit a model request into the model's context window (docs/context.md).

:func:`fit` is a pure function of (messages, fixed tokens, policy, budget): every replica that
builds a step's request from the same history sends the same request, and a prompt cache keeps
matching the prefix that did not change. The loop's history is never changed: the request gets
new message objects where a tool result is cleared.

``clear_tool_results``: once the request is over the trigger (or would not fit the window), old
tool results (all but the ``keep`` most recent, never those of ``exclude_tools``) are replaced,
oldest first, by a placeholder that keeps the result's ``tool_use_id`` and error flag, so every
tool_use still has its tool_result for every provider. Results are cleared in batches, each
freeing at least ``clear_at_least`` tokens, computed from the start of the history: the cleared
prefix grows a whole batch at a time and stays the same between batches (a cached prefix stays
valid). Past the window the last, incomplete batch is cleared too: fitting beats caching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from shared.content import AIMessage, Message, TextBlock, ToolResultMessage, tool_uses, user_text
from shared.events import ContextPolicy
from shared.modelspec import context_window
from shared.tokens import TextCounter, message_tokens, text_counter

CLEARED_TEXT: Final = "[result cleared]"
CLEAR_TOOL_RESULTS: Final = "clear_tool_results"
# What a response may take when the loop sets no max_tokens: reserved out of the window.
DEFAULT_RESERVE: Final = 4_096

# id(message) -> (message, tokens): the message is held so its id is not reused while cached.
Memo = dict[int, tuple[Message, int]]


@dataclass(frozen=True, slots=True)
class Fitted:
    """The request's messages and what fitting them did.

    ``tokens``: the request's input tokens as sent (fixed part included); ``full_tokens``: before
    the strategy; ``limit``: the input budget (the window less the response's reserve).
    """

    messages: list[Message]
    tokens: int
    full_tokens: int
    limit: int
    cleared: int = 0
    freed: int = 0

    @property
    def overflow(self) -> bool:
        return self.tokens > self.limit


def input_limit(window: int, max_tokens: int) -> int:
    """Tokens the request's input may take: the window less the response's ``max_tokens``
    (DEFAULT_RESERVE, at most a quarter of the window, when the loop sets none)."""
    reserve = max_tokens if max_tokens > 0 else min(DEFAULT_RESERVE, window // 4)
    return max(0, window - reserve)


def tokens_of(m: Message, count: TextCounter, memo: Memo | None = None) -> int:
    """``m``'s tokens, cached in ``memo`` (a fold's messages never change once folded)."""
    if memo is None:
        return message_tokens(m, count)
    hit = memo.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    n = message_tokens(m, count)
    memo[id(m)] = (m, n)
    return n


def cleared_result(m: ToolResultMessage) -> ToolResultMessage:
    """The placeholder a cleared tool result is sent as (same tool_use_id and error flag)."""
    return ToolResultMessage(tool_use_id=m.tool_use_id, blocks=[TextBlock(text=CLEARED_TEXT)], is_error=m.is_error)


def fit(
    messages: Sequence[Message],
    fixed: int,
    policy: ContextPolicy,
    limit: int,
    count: TextCounter,
    memo: Memo | None = None,
) -> Fitted:
    """The messages to send: ``messages`` as they are, or with old tool results cleared.

    ``fixed``: the tokens of the rest of the request (system prompt, tool definitions).
    """
    sizes = [tokens_of(m, count, memo) for m in messages]
    total = fixed + sum(sizes)
    threshold = min(policy.trigger, limit) if policy.trigger > 0 else limit
    if policy.strategy != CLEAR_TOOL_RESULTS or total <= threshold:
        return Fitted(list(messages), total, total, limit)
    tool_of = {b.id: b.name for m in messages if isinstance(m, AIMessage) for b in tool_uses(m)}
    results = [i for i, m in enumerate(messages) if isinstance(m, ToolResultMessage)]
    kept = set(results[max(0, len(results) - policy.keep) :])
    excluded = set(policy.exclude_tools)
    placeholder_size = message_tokens(cleared_result(ToolResultMessage()), count)
    # Oldest first: (index, tokens freed), in batches that each free at least clear_at_least.
    batches: list[list[tuple[int, int]]] = [[]]
    batch_freed = 0
    for i in results:
        m = messages[i]
        assert isinstance(m, ToolResultMessage)
        if i in kept or tool_of.get(m.tool_use_id, "") in excluded:
            continue
        gain = sizes[i] - placeholder_size - count(m.tool_use_id)
        if gain <= 0:
            continue
        batches[-1].append((i, gain))
        batch_freed += gain
        if batch_freed >= policy.clear_at_least:
            batches.append([])
            batch_freed = 0
    complete, partial = batches[:-1], batches[-1]
    chosen = [x for b in complete for x in b]
    freed = sum(g for _, g in chosen)
    if total - freed > limit:
        chosen += partial
        freed += sum(g for _, g in partial)
    if not chosen:
        return Fitted(list(messages), total, total, limit)
    out = list(messages)
    for i, _ in chosen:
        m = out[i]
        assert isinstance(m, ToolResultMessage)
        out[i] = cleared_result(m)
    return Fitted(out, total - freed, total, limit, cleared=len(chosen), freed=freed)


def fixed_tokens(system: str, tools: Sequence[msgspec.Struct], count: TextCounter) -> int:
    """The tokens of a request's system prompt and tool definitions (each as its JSON)."""
    return count(system) + sum(count(msgspec.json.encode(t).decode()) for t in tools)


__all__ = [
    "CLEARED_TEXT",
    "COMPACT_INSTRUCTION",
    "COMPACT_SYSTEM",
    "DEFAULT_RESERVE",
    "CompactionPlan",
    "Fitted",
    "Memo",
    "cleared_result",
    "compaction_cut",
    "fit",
    "fit_request",
    "fixed_tokens",
    "input_limit",
    "overflow_message",
    "oversized",
    "oversized_message",
    "plan_compaction",
    "tokens_of",
    "wants_compaction",
]


def fit_request(
    spec: str,
    config: ContextPolicy,
    system: str,
    tools: Sequence[msgspec.Struct],
    messages: Sequence[Message],
    max_tokens: int,
    memo: Memo | None = None,
) -> Fitted | None:
    """:func:`fit` for a loop's step (None: the loop's strategy is "none", nothing is counted)."""
    if config.strategy == "none":
        return None
    count = text_counter(spec)
    window = config.window or context_window(spec)
    return fit(messages, fixed_tokens(system, tools, count), config, input_limit(window, max_tokens), count, memo)


def overflow_message(f: Fitted) -> str:
    """The TurnFailed (context_overflow) text of a request that does not fit even after its strategy."""
    return (
        f"the model request needs {f.tokens} input tokens after its context strategy "
        f"({f.full_tokens} before), over the {f.limit} the window leaves after the response's reserve"
    )


def oversized(
    messages: Sequence[Message], fixed: int, limit: int, count: TextCounter, memo: Memo | None = None
) -> tuple[int, int] | None:
    """The first of ``messages`` that no request can hold, even alone with the fixed part (system
    prompt, tool definitions): its index and tokens; None when each fits on its own.

    Compaction cannot help such a message: the model would only ever see a summary of it, written
    by a summary request that cannot hold it either.
    """
    for i, m in enumerate(messages):
        n = tokens_of(m, count, memo)
        if fixed + n > limit:
            return i, n
    return None


def oversized_message(number: int, tokens: int, fixed: int, limit: int) -> str:
    """The TurnFailed (context_overflow) text of a message larger than the window on its own."""
    return (
        f"message {number} alone needs {fixed + tokens} input tokens ({tokens} for the message, {fixed} for the "
        f"system prompt and tools), over the {limit} the window leaves after the response's reserve: "
        "compaction cannot make it fit"
    )


# --- compact ----------------------------------------------------------------------------------------

COMPACT: Final = "compact"
SUMMARY_MAX_TOKENS: Final = 2_048
COMPACT_SYSTEM: Final = (
    "You summarise an agent's conversation so it can go on without the messages you summarise. "
    "Keep what the rest of the work needs: the user's goals and instructions, decisions made, facts "
    "found (names, paths, numbers, ids), tool results still relevant, errors met, and what was being "
    "done last. Leave out what no longer matters. Write plain text, no preamble."
)
COMPACT_INSTRUCTION: Final = (
    "Summarise the conversation above (including any earlier summary at its start) as instructed. "
    "Your summary replaces these messages from now on."
)


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """A compaction to ask the model for: the loop's first ``upto`` messages become a summary.

    ``messages``: the summary request's messages; ``max_tokens``: the summary's; ``tokens_before``:
    the step's request without a new summary; ``tail_tokens``: the messages kept after it.
    """

    upto: int
    previous_upto: int
    messages: list[Message]
    max_tokens: int
    tokens_before: int
    tail_tokens: int


def wants_compaction(policy: ContextPolicy, f: Fitted) -> bool:
    """The loop compacts and this step's request is over its trigger (or the window)."""
    threshold = min(policy.trigger, f.limit) if policy.trigger > 0 else f.limit
    return policy.strategy == COMPACT and f.tokens > threshold


def compaction_cut(messages: Sequence[Message], start: int, sizes: Sequence[int], keep_tokens: int) -> int:
    """Where a compaction of ``messages`` (the first ``start`` already summarised) ends: the first
    message kept as it is. It is never a tool result (a tool_use and its results stay on one side)
    and the messages from it on take at most ``keep_tokens``; ``len(messages)`` when none can be
    kept. Always more than ``start``, unless nothing is left to summarise (then ``start``)."""
    cut, tail = len(messages), 0
    for i in range(len(messages) - 1, start, -1):
        tail += sizes[i]
        if tail > keep_tokens:
            break
        if not isinstance(messages[i], ToolResultMessage):
            cut = i
    return cut if cut > start else start


def plan_compaction(
    messages: Sequence[Message],
    previous: tuple[int, Message] | None,
    fixed: int,
    window: int,
    f: Fitted,
    count: TextCounter,
    memo: Memo | None = None,
) -> CompactionPlan | None:
    """The compaction a step over its trigger asks for (None: nothing left to summarise).

    ``messages``: the loop's full messages; ``previous``: the latest compaction's ``upto`` and its
    summary message. A quarter of the input budget is kept as it is (the latest messages); the
    summary request holds the earlier summary and the messages it adds, old tool results cleared
    if that is what it takes to fit.
    """
    start = previous[0] if previous is not None else 0
    sizes = [tokens_of(m, count, memo) for m in messages]
    upto = compaction_cut(messages, start, sizes, f.limit // 4)
    if upto <= start:
        return None
    head: list[Message] = [previous[1]] if previous is not None else []
    summary_max = min(SUMMARY_MAX_TOKENS, max(256, f.limit // 8))
    body = [*head, *messages[start:upto], user_text(COMPACT_INSTRUCTION)]
    limit = input_limit(window, summary_max)
    clear = ContextPolicy(strategy=CLEAR_TOOL_RESULTS, keep=0)
    fitted = fit(body, count(COMPACT_SYSTEM), clear, limit, count, memo)
    return CompactionPlan(
        upto=upto,
        previous_upto=start,
        messages=fitted.messages,
        max_tokens=summary_max,
        tokens_before=f.tokens,
        tail_tokens=fixed + sum(sizes[upto:]),
    )
