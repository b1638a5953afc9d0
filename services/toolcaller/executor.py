"""Run one step's batch of tool calls.

Input: the planned calls (:class:`~services.toolcaller.base.PlannedCall`) in the order the model made
them — each the checked tool call (:class:`~shared.toolcall.ToolCall`), the
``tool_execution_id`` the caller minted and the authorisation decision (approve / deny with the
model-visible text / reply = a preset result, e.g. an answered ``ask_user``). Output: exactly one
:class:`~shared.content.ToolResultMessage` per call, in call order, each one text block.

1. Pre-execution checks per call, first failure wins, the tool never runs:
   minted id → ``error: invalid tool call (missing or duplicate id)``;
   (a ``reply`` decision is final here: its text is the result);
   unknown tool (the registry has no worker for it, or the loop does not allow it) →
   ``error: unknown tool: <name>``; a tool whose every worker just failed to answer (NATS no
   responders) and none registered since → ``error: tool unavailable: <name> (no live workers)``;
   a conflicted tool (live workers disagree on version/schema,
   see :mod:`services.toolcaller.registry`) → ``error: tool unavailable: <name> (...)``;
   arguments not strict JSON → ``error: invalid tool arguments (not valid JSON)``;
   denied → the denial text (no decision at all is denied too: fail closed).
2. ToolCallStarted for every call, in call order, before any ToolCallCompleted; pre-execution
   failures complete at once, in call order.
3. Sequential tools run first, one at a time, in call order; then the rest concurrently, at most
   ``max_parallel`` at once, calls with equal write targets one after another in call order.
   Write target: a tool declares ``write_target="<field>"``; the key is the JSON value of that
   top-level argument field (compared across tools; absent, null or "" = no target), so it is
   computed here without a round trip.
4. Normalisation: the worker's result as is (``error: ...`` texts for tool errors are made by the
   worker); no content or only empty text → ``error: empty result``; timeout →
   ``error: tool timed out after <s>s``; no live worker at call time (NATS no responders) →
   ``error: tool unavailable: <name> (no live workers)`` (``(<source> is down, restarting)`` when
   every replica reports its backend down, or the worker's own reason); heartbeat loss, garbage reply, worker
   failure → ``error: tool crashed: <why>``; cancelled via toolctl → ``error: tool call canceled``.
   ToolCallCompleted carries the bounded preview of the (shaped) result text and the duration.
5. Results are shaped to ``max_result_bytes`` (0 = unbounded) with head/tail truncation, and then,
   when the caller asks (``fit``), shrunk further so that the step group fits one durable record.

Cancelling the batch (an anyio cancel scope around :func:`run_batch`) cancels the in-flight calls
(toolctl is published for each) and propagates; no results are returned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

import anyio
import msgspec
from nats.aio.client import Client as NATS

from services.toolcaller import client as cl
from services.toolcaller.base import Fence, PlannedCall, Publisher, RecordFit, SpecOf, step_needs_plan
from services.toolcaller.registry import LiveTool, ToolRegistry
from services.toolwire import tracing as tool_tracing
from services.toolwire.protocol import CallIds
from services.toolwire.spec import ToolSpec, retry_policy, valid_tool_name
from shared import shaping, telemetry
from shared.backoff import Backoff
from shared.codec import encode_live, encode_live_frame
from shared.content import ImageBlock, TextBlock, ToolResultMessage
from shared.events import (
    Event,
    Limits,
    RetryPolicy,
    ToolCallCompleted,
    ToolCallProgress,
    ToolCallStarted,
)
from shared.events import type_name as event_type_name
from shared.settings import Settings
from shared.subjects import Names

log = logging.getLogger("loopwire.tools.executor")

DEFAULT_MAX_PARALLEL = 8

__all__ = ["Executor", "PlannedCall", "caller_span", "fit_results", "make_executor", "normalise", "run_batch"]


@dataclass
class _Item:
    index: int
    plan: PlannedCall
    summary: str
    spec: ToolSpec | None = None
    text: str | None = None  # set once the call's result is known
    is_error: bool = False
    images: list[ImageBlock] = field(default_factory=list)  # a result's images, noted in its text
    write_key: str | None = None
    started: float = field(default_factory=time.monotonic)
    replayed: bool = False


# How often a call that reached its worker too late to start is sent again.
NOT_STARTED_RESENDS: Final = 3


def _write_key(spec: ToolSpec, raw_input: str) -> str | None:
    """The call's write target key (``raw_input`` is strict JSON: the call was checked when planned)."""
    target = spec.write_target
    if not target:
        return None
    args = json.loads(raw_input)
    if not isinstance(args, dict) or args.get(target) in (None, ""):
        return None  # no value, null or "": the call has no write target
    return msgspec.json.encode(args[target], order="sorted").decode()


def _precheck(item: _Item, spec_of: SpecOf) -> None:
    """Pre-execution checks, first failure wins (sets item.text on failure / preset)."""
    use, decision = item.plan.call, item.plan.decision
    if use.minted_id:
        item.text, item.is_error = shaping.INVALID_TOOL_CALL_ID, True
        return
    if decision is not None and decision.effect == "reply":
        item.text, item.is_error = decision.text, False
        return
    spec = spec_of(use.name) if valid_tool_name(use.name) else None
    recorded = item.plan.recorded
    if recorded is not None and decision is not None and decision.effect == "approve":
        # It finished in an earlier run of this step: that outcome stands (even if the tool is gone now).
        timeout = float(spec.timeout_seconds or 0.0) if spec is not None else 0.0
        item.text, item.is_error = normalise(use.name, timeout, recorded)
        item.images = images_of(recorded)
        item.replayed = True
        return
    if spec is None:
        item.text, item.is_error = shaping.unknown_tool(use.name), True
        return
    if isinstance(spec, LiveTool) and spec.replicas == 0 and not spec.rerun_safe:
        # (a read-only or idempotent tool is sent anyway: its retry policy waits for a worker)
        item.text, item.is_error = shaping.tool_unavailable(use.name), True
        return
    if isinstance(spec, LiveTool) and spec.conflict:
        reason = f"conflicting versions live: {', '.join(spec.conflict)}"
        item.text, item.is_error = shaping.tool_unavailable(use.name, reason), True
        return
    if use.invalid:
        item.text, item.is_error = shaping.INVALID_JSON_ARGUMENTS, True
        return
    if decision is None or decision.effect != "approve":
        item.text = decision.text if decision is not None and decision.text else shaping.permission_denied()
        item.is_error = True
        return
    item.spec = spec
    item.write_key = _write_key(spec, use.input)


def caller_span(tool: str, tool_use_id: str, execution_id: str) -> contextlib.AbstractContextManager[object]:
    """The caller's span of a call, for a step that runs again and waits for the call's result
    instead of sending it: the span the first sender opened (its id is derived), so a worker's span
    of a call whose caller died still has its parent."""
    return tool_tracing.call(tool, tool_tracing.CALLER, tool_use_id, execution_id)


async def run_batch(
    planned: Sequence[PlannedCall],
    *,
    loop_id: str,
    turn_id: str,
    step_id: str,
    spec_of: SpecOf,
    client: cl.ToolClient,
    publish: Publisher,
    max_parallel: int = DEFAULT_MAX_PARALLEL,
    max_result_bytes: int = 0,
    on_unavailable: Callable[[str], None] | None = None,
    traceparent: str = "",
    fence: Fence | None = None,
    retries: Mapping[str, RetryPolicy] | None = None,
    fit: RecordFit | None = None,
) -> list[ToolResultMessage]:
    """Run one step's calls; one result per call, in call order (see the module docstring).

    ``fit``: the results are shaped further, when needed, so that they fit one durable record
    together with the step's assistant message (:func:`fit_results`).

    ``retries``: per tool, the loop's override of the tool's retry policy (only read-only and
    idempotent tools are ever retried; see :func:`services.toolwire.spec.retry_policy`).

    ``fence`` (the caller's lease): no call is sent once it stops holding — such calls end as
    canceled, and the caller, which checks its lease before committing, commits nothing — and
    every request tells the worker the time after which it must not start.
    """
    batch = _Batch(
        loop_id=loop_id,
        turn_id=turn_id,
        step_id=step_id,
        client=client,
        publish=publish,
        max_result_bytes=max_result_bytes,
        on_unavailable=on_unavailable,
        traceparent=traceparent,
        fence=fence,
        retries=retries or {},
    )
    items = [
        _Item(index=i, plan=pc, summary=shaping.summary_for_call(pc.call.name, pc.call.input))
        for i, pc in enumerate(planned)
    ]
    for item in items:
        _precheck(item, spec_of)
    for item in items:
        await batch.emit(batch.started(item))
    for item in items:
        if item.text is not None:
            await batch.complete(item)

    batch.unplanned = not step_needs_plan(it.spec for it in items if not it.plan.call.minted_id)
    runnable = [it for it in items if it.text is None]
    for item in runnable:
        if item.spec is not None and item.spec.sequential:
            await batch.run_one(item)
    parallel = [it for it in runnable if it.spec is None or not it.spec.sequential]
    if len(parallel) <= 1:  # the usual step: one call, no task group to run it in
        if parallel:
            await batch.run_one(parallel[0])
    else:
        await batch.run_parallel(parallel, max_parallel)
    return _results(items, fit)


@dataclass
class _Batch:
    """One step's batch: whose calls they are, where their live events go, and how they are sent."""

    loop_id: str
    turn_id: str
    step_id: str
    client: cl.ToolClient
    publish: Publisher
    max_result_bytes: int
    on_unavailable: Callable[[str], None] | None
    traceparent: str
    fence: Fence | None
    retries: Mapping[str, RetryPolicy]
    # The step records no plan (read-only calls only): nobody reads its calls' records (Lw-No-Record).
    unplanned: bool = False

    async def emit(self, event: Event) -> None:
        # Live events are best effort: a failed publish never fails the batch. A publish only
        # appends to the connection's buffer, so events of parallel calls need no lock to stay whole.
        try:
            await self.publish(event)
        except Exception:
            log.warning("could not publish %s", event_type_name(event), exc_info=True)

    def started(self, item: _Item) -> ToolCallStarted:
        return ToolCallStarted(
            loop_id=self.loop_id,
            turn_id=self.turn_id,
            step_id=self.step_id,
            tool_execution_id=item.plan.execution_id,
            tool_name=item.plan.call.name,
            tool_use_id=item.plan.call.id,
            summary=item.summary,
            replayed=item.replayed,
        )

    async def complete(self, item: _Item) -> None:
        assert item.text is not None
        limit = self.max_result_bytes
        if limit and item.images:
            item.text, item.images = shaping.omit_images(
                item.text,
                item.images,
                "larger than the loop's max_result_bytes",
                lambda image: len(image.data or "") > limit,
            )
        item.text = shaping.truncate_result(item.text, limit)
        await self.emit(
            ToolCallCompleted(
                loop_id=self.loop_id,
                turn_id=self.turn_id,
                step_id=self.step_id,
                tool_execution_id=item.plan.execution_id,
                tool_use_id=item.plan.call.id,
                is_error=item.is_error,
                result_preview=shaping.result_preview(item.text),
                duration_ms=int((time.monotonic() - item.started) * 1000),
                replayed=item.replayed,
            )
        )

    async def progress(self, item: _Item, message: str) -> None:
        progress = ToolCallProgress(
            loop_id=self.loop_id,
            turn_id=self.turn_id,
            step_id=self.step_id,
            tool_execution_id=item.plan.execution_id,
            message=shaping.bounded_diagnostic(message),
        )
        await self.emit(progress)

    async def run_one(self, item: _Item) -> None:
        use, spec, fence = item.plan.call, item.spec, self.fence
        assert spec is not None  # set by the checks for every call that runs
        item.started = time.monotonic()
        if fence is not None and not fence.held:
            item.text, item.is_error = shaping.TOOL_CALL_CANCELED, True
            await self.complete(item)
            return
        on_progress = partial(self.progress, item)
        started = time.monotonic()
        with tool_tracing.call(use.name, tool_tracing.CALLER, use.id, item.plan.execution_id) as span:
            call_ids = CallIds(
                loop_id=self.loop_id,
                turn_id=self.turn_id,
                step_id=self.step_id,
                tool_use_id=use.id,
                execution_id=item.plan.execution_id,
                traceparent=telemetry.traceparent() or self.traceparent,
            )
            policy = retry_policy(spec, self.retries.get(use.name))
            fresh = item.plan.fresh
            backoff = Backoff(policy.initial_backoff_seconds, policy.max_backoff_seconds, least=0.05)
            attempt = 1
            while True:
                for resend in range(NOT_STARTED_RESENDS + 1):
                    outcome = await self.client.call(
                        use.name,
                        use.data,
                        ids=call_ids,
                        timeout=float(spec.timeout_seconds),
                        on_progress=on_progress,
                        start_by_ms=fence.start_by_ms() if fence is not None else None,
                        first_send=fresh and attempt == 1 and resend == 0,
                        no_record=self.unplanned,
                    )
                    # Not started because it reached the worker late (a stopped or backlogged worker): it
                    # never ran, so send it again while our lease holds.
                    if outcome.status != cl.NOT_STARTED or fence is None or not fence.held:
                        break
                healthy = spec.healthy  # False: every replica's backend is down (restarting)
                if (
                    outcome.status == cl.UNAVAILABLE
                    and not outcome.worker_id
                    and healthy
                    and self.on_unavailable is not None
                ):
                    self.on_unavailable(use.name)  # "no responders"
                if outcome.status not in policy.retry_on or attempt >= policy.max_attempts:
                    break
                if fence is not None and not fence.held:
                    break
                await on_progress(
                    shaping.retry_notice(attempt, policy.max_attempts, outcome.status, outcome.message, backoff.delay)
                )
                await backoff.sleep()
                attempt += 1
            text = _take_outcome(item, spec, outcome)
            status = ("error" if item.is_error else "ok") if outcome.status == cl.OK else outcome.status
            tool_tracing.finished(span, use.name, tool_tracing.CALLER, status, time.monotonic() - started, text)
        await self.complete(item)

    async def run_parallel(self, items: Sequence[_Item], max_parallel: int) -> None:
        """Run ``items`` at most ``max_parallel`` at once; calls with equal write targets one after
        another, in call order."""
        limiter = anyio.CapacityLimiter(max(1, max_parallel))
        last_of_key: dict[str, anyio.Event] = {}
        async with anyio.create_task_group() as tg:
            for item in items:
                after = done = None
                if item.write_key is not None:
                    after = last_of_key.get(item.write_key)
                    done = last_of_key[item.write_key] = anyio.Event()
                tg.start_soon(self._run_after, item, limiter, after, done)

    async def _run_after(
        self, item: _Item, limiter: anyio.CapacityLimiter, after: anyio.Event | None, done: anyio.Event | None
    ) -> None:
        try:
            if after is not None:
                await after.wait()  # same write target: strictly after the earlier call
            async with limiter:
                await self.run_one(item)
        finally:
            if done is not None:
                done.set()


def _take_outcome(item: _Item, spec: ToolSpec, outcome: cl.CallOutcome) -> str:
    """The call's outcome as its model-visible text (returned too) and images."""
    use = item.plan.call
    text, item.is_error = normalise(use.name, float(spec.timeout_seconds), outcome)
    item.images = images_of(outcome)
    if outcome.status == cl.UNAVAILABLE and not outcome.worker_id and not spec.healthy:
        # Every replica left on purpose while its backend restarts: say so; the tool stays listed.
        source = spec.source or "its backend"
        text = shaping.tool_unavailable(use.name, f"{source} is down, restarting")
    item.text = text
    return text


def _results(items: Sequence[_Item], fit: RecordFit | None) -> list[ToolResultMessage]:
    results = [
        shaping.tool_result_message(it.plan.call.id, it.text or "", is_error=it.is_error, images=it.images)
        for it in items
    ]
    return results if fit is None else fit_results(fit, results)


def _text_and_images(r: ToolResultMessage) -> tuple[str, list[ImageBlock]]:
    """A result :func:`shaping.tool_result_message` made, taken apart: its text, then its images."""
    blocks = r.blocks or []
    text = blocks[0].text if blocks and isinstance(blocks[0], TextBlock) else ""
    return text, [b for b in blocks if isinstance(b, ImageBlock)]


def fit_results(fit: RecordFit, results: list[ToolResultMessage]) -> list[ToolResultMessage]:
    """Shrink tool outputs so the step group fits in one durable record: images are left out first
    (each noted in its text as omitted), then texts are cut (head and tail kept)."""
    budget = int(fit.max_record_bytes * 0.9) - 4096  # room for the envelope, header fields and other events
    if not results or len(msgspec.json.encode([fit.message, *results])) <= budget:
        return results
    parts = [_text_and_images(r) for r in results]
    if any(images for _, images in parts):
        why = "the step's record has no room for it"
        results = [
            shaping.tool_result_message(r.tool_use_id, shaping.omit_images(text, images, why)[0], is_error=r.is_error)
            for r, (text, images) in zip(results, parts, strict=True)
        ]
        if len(msgspec.json.encode([fit.message, *results])) <= budget:
            return results
    fixed = len(msgspec.json.encode(fit.message)) + 200 * len(results)
    per = max(256, (budget - fixed) // len(results))
    return [
        shaping.tool_result_message(r.tool_use_id, _text_and_images(r)[0], is_error=r.is_error, max_bytes=per)
        for r in results
    ]


def images_of(outcome: cl.CallOutcome) -> list[ImageBlock]:
    """The images of a tool's answer, in order (noted in :func:`normalise`'s text where they stood)."""
    if outcome.status != cl.OK or outcome.result is None:
        return []
    return [b for b in outcome.result.blocks or () if isinstance(b, ImageBlock)]


def normalise(name: str, timeout: float, outcome: cl.CallOutcome) -> tuple[str, bool]:
    """A call outcome as (model-visible text, is_error); a result's images are only noted in the text."""
    if outcome.status == cl.OK and outcome.result is not None:
        text = shaping.flatten_to_text(outcome.result.blocks)
        if not text:
            return shaping.EMPTY_RESULT, True
        return text, outcome.result.is_error
    if outcome.status == cl.UNAVAILABLE:
        return shaping.tool_unavailable(name, outcome.message or "no live workers"), True
    if outcome.status == cl.TIMEOUT:
        return shaping.tool_timed_out(timeout), True
    if outcome.status in (cl.CANCELED, cl.NOT_STARTED):
        return shaping.TOOL_CALL_CANCELED, True
    if outcome.status == cl.REFUSED:
        return shaping.tool_refused(outcome.message), True
    return shaping.tool_crashed(outcome.message or "no result"), True


# --- wiring for the model-step service -------------------------------------------------------------


def live_publisher(nc: NATS, names: Names) -> Publisher:
    """Publish each event as a live frame of its own on ``<prefix>.live.<loop_id>`` (core, may be dropped).

    The model-step gathers a loop's events into fewer frames instead (``services.model_step.live``).
    """

    async def publish(event: Event) -> None:
        await nc.publish(names.live(event.loop_id), encode_live_frame([encode_live(event)]))

    return publish


class Executor:
    """The model-step's :class:`~services.toolcaller.base.Execute`: runs a batch with the registry's specs."""

    def __init__(
        self,
        nc: NATS,
        names: Names,
        registry: ToolRegistry,
        settings: Settings,
        *,
        publish: Publisher | None = None,
        client: cl.ToolClient | None = None,
    ) -> None:
        self.registry = registry
        self.client = client or cl.ToolClient(nc, names, heartbeat_seconds=settings.heartbeat_seconds)
        self.publish = publish or live_publisher(nc, names)

    def __call__(
        self,
        *,
        loop_id: str,
        turn_id: str,
        step_id: str,
        planned: Sequence[PlannedCall],
        limits: Limits | None = None,
        spec_of: SpecOf | None = None,
        traceparent: str = "",
        fence: Fence | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        fit: RecordFit | None = None,
    ) -> Awaitable[list[ToolResultMessage]]:
        # The batch's own coroutine, not one awaiting it: every resumption of the step passes
        # through each coroutine frame of its chain.
        lim = limits or Limits()
        return run_batch(
            planned,
            loop_id=loop_id,
            turn_id=turn_id,
            step_id=step_id,
            spec_of=spec_of or self.registry.get,
            client=self.client,
            publish=self.publish,
            max_parallel=lim.max_parallel or DEFAULT_MAX_PARALLEL,
            max_result_bytes=lim.max_result_bytes,
            on_unavailable=self.registry.mark_no_workers,
            traceparent=traceparent,
            fence=fence,
            retries=retries,
            fit=fit,
        )

    async def close(self) -> None:
        await self.client.close()


def make_executor(
    nc: NATS, names: Names, registry: ToolRegistry, settings: Settings, *, publish: Publisher | None = None
) -> Executor:
    return Executor(nc, names, registry, settings, publish=publish)
