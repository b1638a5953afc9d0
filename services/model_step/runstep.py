"""Run one step of an open turn: continue a step recorded before, or check the budget, fit the
request into the context window, ask the model, and commit its answer or authorise its calls."""

from __future__ import annotations

from services.model_step import context, gates, toolstep, tracing, turns
from services.model_step.budget import FAIL, GO, Verdict, budget_verdict
from services.model_step.compaction import compact
from services.model_step.drive import Drive
from services.model_step.models.accumulator import StreamAccumulator
from services.model_step.models.base import Model, ModelError, ModelRequest, ModelStreamError, ToolDef, is_delta
from services.model_step.policy import tool_allowed_for_loop
from services.model_step.steps import step_id_for
from services.toolcaller.base import step_needs_plan
from shared import events as ev
from shared import metrics, shaping
from shared.content import AIMessage
from shared.events import now_rfc3339
from shared.history import LoopHistory, OpenTurn
from shared.modelspec import model_id
from shared.results import StepPlan


async def run_step(d: Drive, h: LoopHistory) -> None:
    t = h.open_turn
    assert t is not None and h.config is not None
    step_id = step_id_for(t.turn_id, t.steps)
    results = d.shared.results
    if results is not None and d.made != h.last_seq:
        plan = await results.plan(step_id, loop_id=h.loop_id)
        if plan is not None and plan.loop_id == h.loop_id and plan.turn_id == t.turn_id:
            # This step ran before (its model-step stopped before committing it): continue the
            # recorded decision instead of asking the model again, whose new calls would be new ids.
            await toolstep.run_calls(d, h, t, step_id, plan.step, rerun=True)
            return
    # Before the model is asked: a step already asked (its plan, above) is continued whatever
    # the budget says, as it was paid for.
    verdict = budget_verdict(h, now_rfc3339())
    if verdict.action != GO:
        await _budget_stop(d, h, t, step_id, verdict)
        return
    prepared = await _request(d, h, t, step_id)
    if prepared is None:
        return
    model, request, fitted = prepared
    ai = await _ask(d, h, t, step_id, model, request, fitted)
    if ai is not None:
        await _take(d, h, t, step_id, ai)


async def _budget_stop(d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, verdict: Verdict) -> None:
    """Fail the turn (kind budget) or open a budget gate before the step asks the model."""
    for limit in verdict.limits:
        metrics.inc(metrics.BUDGET_STOPS, limit, verdict.action)
    if verdict.action == FAIL:
        await turns.fail_turn(d, h, "budget", verdict.message)
        return
    await gates.open_budget_gate(d, h, t, step_id, verdict)


async def _request(
    d: Drive, h: LoopHistory, t: OpenTurn, step_id: str
) -> tuple[Model, ModelRequest, context.Fitted | None] | None:
    """The step's model and request, fitted into the context window; None when the step ended
    here instead (a compaction committed, or the turn failed)."""
    assert h.config is not None
    spec = d.model_spec(h)
    try:
        model = d.shared.models(spec)
    except ModelError as e:
        await turns.fail_turn(d, h, "model_error", str(e))
        return None
    request = ModelRequest(
        model=model.model,
        system=h.config.system,
        messages=list(h.model_messages),  # the fold's own messages: adapters only read them
        tools=_tool_defs(d, h),
        max_tokens=h.config.limits.max_tokens,
    )
    fitted = context.fit_request(
        spec, h.config.context, request.system, request.tools, request.messages, request.max_tokens, d.memo
    )
    if fitted is not None:
        if context.wants_compaction(h.config.context, fitted) and await compact(d, h, t, step_id, fitted, request):
            return None  # committed: the step runs again from the compacted history
        if fitted.overflow:
            await turns.fail_turn(d, h, "context_overflow", context.overflow_message(fitted))
            return None
        request.messages = fitted.messages
        if h.compaction is not None:
            request.summarised = list(map(type, h.messages[: h.compaction.upto])).count(AIMessage)
    return model, request, fitted


async def _ask(
    d: Drive,
    h: LoopHistory,
    t: OpenTurn,
    step_id: str,
    model: Model,
    request: ModelRequest,
    fitted: context.Fitted | None,
) -> AIMessage | None:
    """Stream the model's answer, its deltas out live; None when the model failed (the turn with it)."""
    assert h.config is not None
    spec = d.model_spec(h)
    acc = StreamAccumulator()
    d.check()
    guard = d.guard
    model_name = model_id(request.model or spec)
    chat = tracing.chat(model_name, spec.split(":", 1)[0], h, step_id)

    def delta_of(c: ev.Chunk) -> ev.TokenDelta:
        return ev.TokenDelta(loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, turn_index=t.turn_index, chunk=c)

    live = d.shared.outbox
    try:
        with chat as chat_span:
            if fitted is not None:
                tracing.chat_context(
                    chat_span, h.config.context.strategy, fitted.tokens, fitted.full_tokens, fitted.cleared
                )
            async for chunk in model.stream(request):
                if guard is not None and not guard.held:
                    guard.check()
                if is_delta(chunk.kind):
                    live.chunk(h.loop_id, delta_of, chunk.kind, chunk.text, chunk.index, chunk.id, chunk.name)
                acc.add(chunk)
            tracing.chat_result(chat_span, model_name, acc)
    except ModelStreamError as e:
        prefix = shaping.safe_prefix(acc.message(), shaping.TRUNCATED_NOTICE)
        await turns.fail_turn(d, h, "model_error", f"model stream failed: {e}", prefix)
        return None
    except ModelError as e:
        await turns.fail_turn(d, h, "model_error", str(e))
        return None
    return acc.message()


async def _take(d: Drive, h: LoopHistory, t: OpenTurn, step_id: str, ai: AIMessage) -> None:
    """Commit the model's answer, or plan its calls (within the turn's tool limits) and authorise them."""
    assert h.config is not None
    if shaping.is_empty_response(ai):
        await turns.fail_turn(d, h, "empty_response", "the model returned an empty response")
        return
    stored, calls = shaping.sanitize_step(ai)
    if not calls:
        await turns.answer(d, h, t, step_id, stored)
        return
    limits = h.config.limits
    iterations, calls_so_far = t.tool_iterations + 1, t.tool_calls + len(calls)
    if iterations > limits.max_iterations or calls_so_far > limits.max_calls_per_turn:
        await turns.fail_turn(
            d,
            h,
            "tool_limit",
            f"tool limit reached: iterations {iterations}/{limits.max_iterations}, "
            f"calls {calls_so_far}/{limits.max_calls_per_turn}",
        )
        return
    suspended = ev.SuspendedStep(
        message=stored,
        calls=[c.raw() for c in calls],
        decisions=[],
        iteration=iterations,
        calls_so_far=calls_so_far,
    )
    results = d.shared.results
    if results is not None and step_needs_plan(d.tool_spec(h, c.name) for c in calls if not c.minted_id):
        # (a step of read-only calls only needs no plan: asking the model again is harmless)
        d.check()
        await results.record_plan(StepPlan(loop_id=h.loop_id, turn_id=t.turn_id, step_id=step_id, step=suspended))
    await toolstep.run_calls(d, h, t, step_id, suspended, calls)


def _tool_defs(d: Drive, h: LoopHistory) -> list[ToolDef]:
    """The live tools the loop may call, as the model is offered them."""
    out = []
    for spec in d.shared.tools.live():
        if tool_allowed_for_loop(h.config, spec.name):
            out.append(ToolDef(name=spec.name, description=spec.description, input_schema=spec.input_schema))
    return out
