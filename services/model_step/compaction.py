"""Compaction: have the model summarise a loop's older messages and commit the summary
(``ContextCompacted``) before a step whose request is over its context policy's trigger."""

from __future__ import annotations

from services.model_step import context, tracing, turns
from services.model_step.drive import Drive
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import Model, ModelError, ModelRequest
from shared import events as ev
from shared import tokens
from shared.content import AIMessage, text_of
from shared.events import Event, now_rfc3339
from shared.history import LoopHistory, OpenTurn, compaction_message
from shared.modelspec import context_window
from shared.pricing import price_of, step_cost_micro_usd


async def compact(
    d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, fitted: context.Fitted, step: ModelRequest
) -> bool:
    """Have the model summarise the older messages and commit it (ContextCompacted); False when
    nothing is left to summarise. A failed summary fails the turn (and returns True), and so does
    a message no request can hold even alone (``context_overflow``, nothing asked or committed).

    A model-step stopped meanwhile committed nothing: whoever runs the step next compacts the
    same messages again (the range depends only on the history). Two replicas cannot both
    commit one: the commit is fenced by the sequence the step was read at, and its event id is
    derived from the range, so an unanswered retry that was stored is a duplicate.
    """
    assert h.config is not None
    policy = h.config.context
    loop_spec = d.model_spec(h)
    spec = policy.model or loop_spec
    count = tokens.text_counter(loop_spec)
    fixed = context.fixed_tokens(step.system, step.tools, count)
    c = h.compaction
    previous = (c.upto, compaction_message(c.summary)) if c is not None else None
    if await _fail_oversized(d, h, previous[0] if previous is not None else 0, fixed, fitted.limit, count):
        return True
    window = policy.window or context_window(loop_spec)
    plan = context.plan_compaction(h.messages, previous, fixed, window, fitted, count, d.memo)
    if plan is None:
        return False
    try:
        model = d.shared.models(spec)
    except ModelError as e:
        await turns.fail_turn(d, h, "model_error", f"compaction: {e}")
        return True
    request = ModelRequest(
        model=model.model,
        system=context.COMPACT_SYSTEM,
        messages=plan.messages,
        max_tokens=plan.max_tokens,
        compaction=True,
    )
    d.check()
    try:
        message = await _summarise(d, model, request)
    except ModelError as e:
        await turns.fail_turn(d, h, "model_error", f"compaction: the model failed: {e}")
        return True
    summary = text_of(message).strip()
    if not summary:
        await turns.fail_turn(d, h, "empty_response", "compaction: the model returned an empty summary")
        return True
    after = plan.tail_tokens + tokens.message_tokens(compaction_message(summary), count)
    usage = message.usage
    event = ev.ContextCompacted(
        loop_id=h.loop_id,
        turn_id=t.turn_id,
        step_id=step_id,
        upto=plan.upto,
        previous_upto=plan.previous_upto,
        summary=summary,
        tokens_before=plan.tokens_before,
        tokens_after=after,
        model=spec,
        usage=usage,
        cost_micro_usd=step_cost_micro_usd(price_of(spec), usage) if usage is not None else 0,
        event_id=ev.compaction_id_for(h.loop_id, plan.upto),
        created_at=now_rfc3339(),
    )

    def build(cur: LoopHistory) -> list[Event] | None:
        done = cur.compaction.upto if cur.compaction is not None else 0
        return None if done != plan.previous_upto else [event]

    await d.commit(h, build)
    tracing.chat_context(None, context.COMPACT, after, plan.tokens_before, 0)
    return True


async def _fail_oversized(
    d: Drive, h: LoopHistory, start: int, fixed: int, limit: int, count: tokens.TextCounter
) -> bool:
    """Fail the turn (``context_overflow``) if a message not yet summarised is too large for any
    request on its own. Checked before anything is asked or committed: no summary is written."""
    big = context.oversized(h.messages[start:], fixed, limit, count, d.memo)
    if big is None:
        return False
    index, size = big
    await turns.fail_turn(d, h, "context_overflow", context.oversized_message(start + index + 1, size, fixed, limit))
    return True


async def _summarise(d: Drive, model: Model, request: ModelRequest) -> AIMessage:
    """The model's summary, streamed while the drive holds the loop."""
    acc = StreamAccumulator()
    guard = d.guard
    async for chunk in model.stream(request):
        if guard is not None and not guard.held:
            guard.check()
        acc.add(chunk)
    return acc.message()
