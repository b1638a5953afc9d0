"""End to end on each real adapter: a model-step process pointed at a local server that speaks
the provider's streaming wire format runs a real tool worker and commits the demo model's history shape."""

from __future__ import annotations

import uuid

import pytest
from nats.aio.client import Client as NATS

from shared import events as ev
from shared.client import LoopClient
from shared.content import AIMessage, ToolResultMessage, text_of, tool_uses
from shared.settings import Settings
from tests.fakeproviders import FakeProvider, Reply, anthropic_stream, by_position, fragments, openai_stream
from tests.syshelpers import TOOL_TURN_HISTORY, check_history_invariants, history, system, types, wait_history

pytestmark = [pytest.mark.anyio, pytest.mark.system]

ARGS = '{"expression": "17*23"}'


def _replies(api: str) -> list[Reply]:
    if api == "openai":
        return [
            Reply(
                frames=openai_stream(
                    text=["Let me ", "compute."],
                    tool_calls=[("call_1", "calculator", fragments(ARGS, 3))],
                    usage=(12, 7),
                )
            ),
            Reply(frames=openai_stream(text=["17*23 ", "is 391."], usage=(30, 4))),
        ]
    return [
        Reply(
            frames=anthropic_stream(
                text=["Let me ", "compute."], tool_uses=[("toolu_1", "calculator", fragments(ARGS, 3))], usage=(12, 7)
            )
        ),
        Reply(frames=anthropic_stream(text=["17*23 ", "is 391."], usage=(30, 4))),
    ]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_loop_on_a_real_adapter_calls_a_tool_and_answers(api: str, settings: Settings, nc: NATS) -> None:
    with FakeProvider(api, responder=by_position(api, _replies(api))) as fake:
        env = fake.env(api_key="sk-secret-e2e", model="test-model")
        with system(settings, tools=("calculator",), env=env) as sysm:
            lc = LoopClient(nc, settings.names)
            loop_id = str(uuid.uuid4())
            await lc.start(loop_id)  # the model comes from LW_MODEL of the model-step
            await lc.input(loop_id, "what is 17*23?")
            h = await wait_history(nc, settings, loop_id, lambda h: h.idle)
            events = await history(nc, settings, loop_id)
            check_history_invariants(events)
            assert types(events) == TOOL_TURN_HISTORY
            first, second = (e for _, e in events if isinstance(e, ev.StepDone))
            ai, result = first.messages
            assert isinstance(ai, AIMessage) and isinstance(result, ToolResultMessage)
            (use,) = tool_uses(ai)
            assert use.name == "calculator" and bytes(use.input) == ARGS.encode()
            assert not result.is_error and text_of(result) == "391"
            assert text_of(second.messages[0]) == "17*23 is 391."
            # usage summed from StepDone only
            assert (h.usage.input_tokens, h.usage.output_tokens) == (42, 11)
            # the second request carried the tool call and its result back to the provider
            body = fake.requests[-1].json()
            dumped = str(body)
            assert "391" in dumped and "calculator" in dumped
            assert "sk-secret-e2e" not in sysm.logs()
