"""Token counting and fitting a request into a context window (services/model_step/context.py)."""

from __future__ import annotations

import hashlib
import math

import msgspec
import pytest

from services.model_step.context import (
    CLEARED_TEXT,
    COMPACT_INSTRUCTION,
    cleared_result,
    compaction_cut,
    fit,
    fit_request,
    input_limit,
    overflow_message,
    oversized,
    oversized_message,
    plan_compaction,
    wants_compaction,
)
from shared import events as ev
from shared.content import (
    AIMessage,
    Block,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultMessage,
    ToolUseBlock,
    Usage,
    tool_result,
    user_text,
)
from shared.events import ContextPolicy
from shared.history import LoopHistory, compaction_message
from shared.modelspec import DEFAULT_WINDOW, context_window
from shared.tokens import ESTIMATE_MARGIN, IMAGE_TOKENS, encoding_name, estimate, message_tokens, text_counter


def _payload(i: int, size: int) -> str:
    """``size`` hex digits, different for each ``i`` (about 1,000 estimated tokens a 1,300)."""
    return b"".join(hashlib.sha256(f"{i}:{k}".encode()).digest() for k in range(size // 64 + 1)).hex()[:size]


def _step(i: int, tool: str = "read", size: int = 1300) -> list[Message]:
    use = ToolUseBlock(id=f"c{i}", name=tool, input=msgspec.Raw(b'{"n":1}'))
    return [AIMessage(blocks=[use]), tool_result(f"c{i}", _payload(i, size))]


def _history(n: int, tool: str = "read", size: int = 1300) -> list[Message]:
    out: list[Message] = [user_text("go")]
    for i in range(n):
        out += _step(i, tool, size)
    return out


def _cleared(msgs: list[Message]) -> list[str]:
    return [
        m.tool_use_id for m in msgs if isinstance(m, ToolResultMessage) and m.blocks == [TextBlock(text=CLEARED_TEXT)]
    ]


def test_estimate_is_the_o200k_count_with_a_margin() -> None:
    o200k = text_counter("openai:gpt-4o")
    assert estimate("") == 0
    assert estimate("hello world") == 3  # 2 tokens * 1.35, rounded up
    text = "The quick brown fox jumps over the lazy dog. " * 50
    assert estimate(text) == math.ceil(o200k(text) * ESTIMATE_MARGIN)


def test_openai_models_are_counted_with_their_tokenizer() -> None:
    assert encoding_name("openai:gpt-4o") == "o200k_base"
    assert encoding_name("openai:gpt-4-turbo") == "cl100k_base"
    assert encoding_name("anthropic:claude-sonnet-4") == "estimate"
    assert encoding_name("scripted:x.json") == "o200k_base"
    assert encoding_name("ollama:llama3") == "estimate"
    count = text_counter("openai:gpt-4o")
    assert count("hello world") == 2
    assert text_counter("openai:gpt-4")("hello world") == 2


def test_message_tokens_count_tool_uses_results_and_images() -> None:
    use = AIMessage(
        blocks=[ToolUseBlock(id="c1", name="read", input=msgspec.Raw(b'{"path":"' + _payload(0, 300).encode() + b'"}'))]
    )
    assert message_tokens(use, estimate) > 100
    assert message_tokens(tool_result("c1", _payload(1, 1300)), estimate) >= 950
    img = user_text("look")
    img.blocks = [*(img.blocks or []), ImageBlock(media_type="image/png", data="A" * 100_000)]
    assert IMAGE_TOKENS <= message_tokens(img, estimate) < IMAGE_TOKENS + 50


def test_context_windows() -> None:
    assert context_window("openai:gpt-4o") == 128_000
    assert context_window("openai:gpt-4o-mini-2024-07-18") == 128_000
    assert context_window("openai:gpt-4") == 8_192
    assert context_window("anthropic:claude-sonnet-4-5") == 200_000
    assert context_window("anthropic:some-future-model") == 200_000
    assert context_window("demo") == DEFAULT_WINDOW
    assert input_limit(16_000, 1_000) == 15_000
    assert input_limit(16_000, 0) == 12_000  # a quarter of a small window reserved
    assert input_limit(200_000, 0) == 200_000 - 4_096


def test_none_and_below_trigger_send_the_history_unchanged() -> None:
    msgs = _history(5)
    f = fit(msgs, 10, ContextPolicy(), 100, estimate)
    assert f.messages == msgs and f.cleared == 0 and f.overflow  # "none" does nothing
    policy = ContextPolicy(strategy="clear_tool_results", trigger=100_000)
    f = fit(msgs, 10, policy, 200_000, estimate)
    assert f.messages == msgs and f.cleared == 0 and f.tokens == f.full_tokens


def test_clearing_keeps_the_most_recent_and_pairs() -> None:
    msgs = _history(10)
    policy = ContextPolicy(strategy="clear_tool_results", trigger=2_000, keep=3)
    f = fit(msgs, 0, policy, 100_000, estimate)
    assert _cleared(f.messages) == [f"c{i}" for i in range(7)]
    assert f.cleared == 7 and f.tokens < 2_000 + 3 * 1_100 and f.full_tokens - f.tokens == f.freed
    # Every tool_use keeps its tool_result, in place; the history itself is unchanged.
    assert [type(m) for m in f.messages] == [type(m) for m in msgs]
    assert [getattr(m, "tool_use_id", "") for m in f.messages] == [getattr(m, "tool_use_id", "") for m in msgs]
    assert not _cleared(msgs)
    # Pure: the same inputs give the same request.
    assert fit(msgs, 0, policy, 100_000, estimate) == f


def test_excluded_tools_are_never_cleared() -> None:
    msgs: list[Message] = [user_text("go")]
    for i in range(6):
        msgs += _step(i, "keepme" if i % 2 else "read")
    policy = ContextPolicy(strategy="clear_tool_results", trigger=1_000, keep=0, exclude_tools=["keepme"])
    f = fit(msgs, 0, policy, 100_000, estimate)
    assert _cleared(f.messages) == ["c0", "c2", "c4"]


def test_clear_at_least_clears_whole_batches_only() -> None:
    # Each result frees about 1,000 tokens: batches of three under clear_at_least 2,500.
    policy = ContextPolicy(strategy="clear_tool_results", trigger=1_000, keep=1, clear_at_least=2_500)
    f = fit(_history(3), 0, policy, 100_000, estimate)  # two clearable: less than one batch
    assert f.cleared == 0 and f.messages == _history(3)
    f = fit(_history(5), 0, policy, 100_000, estimate)  # four clearable: one batch of three
    assert _cleared(f.messages) == ["c0", "c1", "c2"]
    f = fit(_history(7), 0, policy, 100_000, estimate)  # six: two batches; the prefix grows by batches
    assert _cleared(f.messages) == ["c0", "c1", "c2", "c3", "c4", "c5"]


def test_the_window_beats_trigger_and_clear_at_least() -> None:
    msgs = _history(3)
    full = fit(msgs, 0, ContextPolicy(), 10**9, estimate).tokens
    # Below the trigger, and a batch too small: still cleared because the window would be exceeded.
    policy = ContextPolicy(strategy="clear_tool_results", trigger=10**9, keep=1, clear_at_least=10**6)
    f = fit(msgs, 0, policy, full - 500, estimate)
    assert _cleared(f.messages) == ["c0", "c1"] and not f.overflow


def test_overflow_when_nothing_more_can_go() -> None:
    msgs = [user_text(_payload(0, 60_000))]
    policy = ContextPolicy(strategy="clear_tool_results")
    f = fit(msgs, 0, policy, 16_000, estimate)
    assert f.overflow and f.cleared == 0
    assert f"needs {f.tokens} input tokens" in overflow_message(f) and "16000" in overflow_message(f)


def test_placeholder_keeps_the_pairing_fields() -> None:
    r = tool_result("c9", "boom", is_error=True)
    c = cleared_result(r)
    assert c.tool_use_id == "c9" and c.is_error and c.blocks == [TextBlock(text=CLEARED_TEXT)]


def test_fit_request_uses_the_window_override_and_the_reserve() -> None:
    assert fit_request("demo", ContextPolicy(), "", [], _history(3), 0) is None
    policy = ContextPolicy(strategy="clear_tool_results", window=4_000, keep=1)
    f = fit_request("scripted:x.json", policy, "sys", [], _history(5), 1_000)
    assert f is not None and f.limit == 3_000 and not f.overflow and f.cleared == 4


@pytest.mark.parametrize("keep", [0, 1, 5, 50])
def test_keep_larger_than_the_results(keep: int) -> None:
    policy = ContextPolicy(strategy="clear_tool_results", trigger=1, keep=keep)
    f = fit(_history(5), 0, policy, 10**9, estimate)
    assert f.cleared == max(0, 5 - keep)


# --- compact ----------------------------------------------------------------------------------------


def _sizes(msgs: list[Message]) -> list[int]:
    return [message_tokens(m, estimate) for m in msgs]


def test_compaction_cut_never_splits_a_tool_use_from_its_result() -> None:
    msgs = _history(10)  # user, then (ai, tool) pairs: a cut is at the user message or an ai message
    sizes = _sizes(msgs)
    for keep in (0, 500, 1_100, 2_500, 5_000, 50_000):
        cut = compaction_cut(msgs, 0, sizes, keep)
        assert cut == len(msgs) or not isinstance(msgs[cut], ToolResultMessage)
        assert sum(sizes[cut:]) <= keep or cut == len(msgs)
    # The tail kept is the largest that fits: two pairs under the sum of three.
    three = sum(sizes[-6:])
    assert compaction_cut(msgs, 0, sizes, three - 1) == len(msgs) - 4
    assert compaction_cut(msgs, 0, sizes, three) == len(msgs) - 6
    # A tail too large for any pair: everything is summarised.
    assert compaction_cut(msgs, 0, sizes, 500) == len(msgs)
    # Nothing left after what is already summarised: no cut; else the cut is past it.
    assert compaction_cut(msgs, len(msgs), sizes, three) == len(msgs)
    assert compaction_cut(msgs, len(msgs) - 4, sizes, three) == len(msgs) - 2
    assert compaction_cut(msgs, len(msgs) - 2, sizes, three) == len(msgs)


def test_a_step_with_several_calls_stays_whole() -> None:
    uses: list[Block] = [ToolUseBlock(id=f"p{j}", name="read", input=msgspec.Raw(b"{}")) for j in range(3)]
    msgs: list[Message] = [user_text("go"), AIMessage(blocks=uses)]
    msgs += [tool_result(f"p{j}", _payload(j, 1300)) for j in range(3)]
    msgs += _step(9)
    sizes = _sizes(msgs)
    assert compaction_cut(msgs, 0, sizes, 1_500) == 5  # after the three results, never between them
    assert compaction_cut(msgs, 0, sizes, 2_500) == 5


def test_plan_compaction_summarises_the_older_messages() -> None:
    msgs = _history(25)
    policy = ContextPolicy(strategy="compact", window=16_000)
    f = fit_request("scripted:x.json", policy, "", [], msgs, 256)
    assert f is not None and wants_compaction(policy, f)
    plan = plan_compaction(msgs, None, 0, 16_000, f, text_counter("scripted:x.json"))
    assert plan is not None and plan.previous_upto == 0 and 0 < plan.upto < len(msgs)
    assert not isinstance(msgs[plan.upto], ToolResultMessage)
    assert plan.tail_tokens <= f.limit // 4 and plan.tokens_before == f.tokens
    # The request: the messages summarised, old results cleared to fit, and the instruction last.
    assert plan.messages[-1] == user_text(COMPACT_INSTRUCTION)
    sent = fit(plan.messages, 0, ContextPolicy(), 10**9, estimate)
    assert sent.tokens <= input_limit(16_000, plan.max_tokens)
    # A later compaction starts from the earlier summary.
    summary = compaction_message("read the file 12 times")
    again = plan_compaction([*msgs, *_step(20), *_step(21)], (plan.upto, summary), 0, 16_000, f, estimate)
    assert again is not None and again.previous_upto == plan.upto and again.upto > plan.upto
    assert again.messages[0] == summary
    assert plan_compaction(msgs, (len(msgs), summary), 0, 16_000, f, estimate) is None


def test_a_message_no_request_can_hold_alone_is_found() -> None:
    count = text_counter("scripted:x.json")
    big = user_text(" ".join(f"w{i}" for i in range(600)))  # 1,200 tokens or so
    size = message_tokens(big, count)
    msgs = [user_text("go"), *_step(0, size=200), big]
    assert oversized(msgs, 0, size, count) is None  # it fits alone, just
    assert oversized(msgs, 1, size, count) == (3, size)  # with the system prompt and tools it does not
    assert oversized(msgs[:3], 0, 768, count) is None
    text = oversized_message(4, size, 1, size)
    assert f"message 4 alone needs {size + 1} input tokens" in text and f"over the {size}" in text


def test_below_the_trigger_nothing_is_compacted() -> None:
    policy = ContextPolicy(strategy="compact", trigger=50_000)
    f = fit_request("scripted:x.json", policy, "", [], _history(5), 0)
    assert f is not None and not wants_compaction(policy, f)
    assert wants_compaction(ContextPolicy(strategy="compact", trigger=1_000), f)
    assert not wants_compaction(ContextPolicy(strategy="clear_tool_results", trigger=1_000), f)


def test_the_fold_keeps_every_message_and_sends_the_summary() -> None:
    loop, turn = "5e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e", "6e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e"
    msgs = _history(4)
    h = LoopHistory(loop_id=loop, messages=list(msgs))

    def compacted(upto: int, previous: int, summary: str) -> ev.ContextCompacted:
        return ev.ContextCompacted(loop_id=loop, turn_id=turn, upto=upto, previous_upto=previous, summary=summary)

    h.apply(compacted(5, 0, "first"), 10)
    assert h.messages == msgs and h.model_messages == [compaction_message("first"), *msgs[5:]]
    h.apply(compacted(5, 0, "a repeat"), 11)  # the same range again: ignored
    h.apply(compacted(7, 3, "stale"), 12)  # not continuing the latest: ignored
    h.apply(compacted(99, 5, "beyond"), 13)  # covers messages not folded: ignored
    assert h.compaction is not None and h.compaction.summary == "first"
    h.apply(compacted(7, 5, "second"), 14)
    assert h.model_messages == [compaction_message("second"), *msgs[7:]] and h.messages == msgs
    assert ev.compaction_id_for(loop, 7) == ev.compaction_id_for(loop, 7) != ev.compaction_id_for(loop, 5)


def test_a_compaction_s_usage_and_cost_count_like_a_step_s_once() -> None:
    loop, turn = "5e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e", "6e7a9c1e-3a5c-4e7a-9c1e-3a5c7e9a1c3e"
    h = LoopHistory(loop_id=loop)
    h.apply(ev.TurnStarted(loop_id=loop, turn_id=turn, turn_index=1, message=user_text("go")), 1)
    h.messages.extend(_history(4))
    spent = Usage(input_tokens=900, output_tokens=100)
    summary = ev.ContextCompacted(loop_id=loop, turn_id=turn, upto=3, summary="s", usage=spent, cost_micro_usd=250)
    h.apply(summary, 2)
    h.apply(summary, 3)  # a repeat of the stored one: not counted again
    assert h.open_turn is not None
    assert (h.usage, h.cost_micro_usd) == (spent, 250)
    assert (h.open_turn.usage, h.open_turn.cost_micro_usd) == (spent, 250)


def test_the_start_options_make_a_policy() -> None:
    from services.cli import build_parser
    from services.cli.contextopts import context_from_args
    from services.cli.errors import CliError

    def policy(*args: str) -> ContextPolicy | None:
        return context_from_args(build_parser().parse_args(["start", *args]))

    assert policy() is None
    assert policy("--context", "none") == ContextPolicy()
    got = policy(
        "--context=clear_tool_results",
        "--context-trigger=1000",
        "--context-keep=2",
        "--context-clear-at-least=500",
        "--context-exclude-tool=kv_memory",
        "--context-exclude-tool=clock",
        "--context-window=16000",
    )
    assert got == ContextPolicy(
        strategy="clear_tool_results",
        window=16_000,
        trigger=1_000,
        keep=2,
        clear_at_least=500,
        exclude_tools=["kv_memory", "clock"],
    )
    assert policy("--context", "compact", "--context-model", "openai:gpt-4o-mini") == ContextPolicy(
        strategy="compact", model="openai:gpt-4o-mini"
    )
    with pytest.raises(CliError, match="need --context"):
        policy("--context-keep", "2")
    with pytest.raises(CliError, match="a whole number from 0 to"):
        policy("--context", "compact", "--context-window", "-1")
