"""The console in a real browser against ``loopwire up`` with large histories: a loop of 10,000 steps
opens fast and pages backwards, and thousands of loops are paged and filtered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anyio
import msgspec
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from shared.client import CommitClient
from shared.connect import connect
from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, tool_result, user_text
from shared.events import Cause, InputSubmitted, LoopClosed, LoopStarted, StepDone, TurnStarted, make
from shared.settings import Settings
from tests.system.consolebrowser import (
    Deployment,
    browser_session,
    on_page,
    open_loop,
    running_deployment,
    text_now,
    wait_until,
)

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with running_deployment(tmp_path_factory.mktemp("console")) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with browser_session() as driver:
        yield driver


# --- histories written straight through the committer ------------------------------------------


def _many_steps(loop_id: str, steps: int, big: str) -> list[StepDone]:
    """One turn's ``steps`` tool steps; the last one's result is ``big``."""
    turn_id = str(uuid.uuid4())

    def step(k: int) -> StepDone:
        use = f"toolu_{k}"
        ai = AIMessage(
            blocks=[TextBlock(text=f"step {k}"), ToolUseBlock(id=use, name="calculator", input=msgspec.Raw(b"{}"))],
            usage=Usage(input_tokens=1, output_tokens=1),
        )
        result = big if k == steps - 1 else str(k)
        return make(
            StepDone,
            loop_id=loop_id,
            turn_id=turn_id,
            step_id=str(uuid.uuid4()),
            messages=[ai, tool_result(use, result)],
        )

    return [step(k) for k in range(steps)]


async def _write_long_loop(d: Deployment, loop_id: str, steps: list[StepDone]) -> None:
    """A loop with one turn of ``steps``, committed through the committer 250 records at a time."""
    settings = Settings.from_env({}, nats_urls=(d.nats_url,))
    nc = await connect(settings)
    try:
        client = CommitClient(nc, settings.names, 30)
        cid = str(uuid.uuid4())
        turn = steps[0].turn_id
        head = [
            make(LoopStarted, loop_id=loop_id, model="scripted", cause=Cause(command_id=str(uuid.uuid4()))),
            make(InputSubmitted, loop_id=loop_id, message=user_text("many steps"), cause=Cause(command_id=cid)),
            make(
                TurnStarted,
                loop_id=loop_id,
                turn_id=turn,
                turn_index=1,
                message=user_text("many steps"),
                cause=Cause(command_id=cid),
            ),
        ]
        last = (await client.commit(loop_id, 0, head)).last_seq
        for base in range(0, len(steps), 250):
            last = (await client.commit(loop_id, last, steps[base : base + 250])).last_seq
    finally:
        await nc.close()


# --- tests ----------------------------------------------------------------------------------------


def test_a_10000_step_loop_opens_fast_and_scrolls(d: Deployment, browser: WebDriver) -> None:
    loop_id = str(uuid.uuid4())
    steps = 10_000
    big = "x" * 50_000

    t0 = time.monotonic()
    anyio.run(_write_long_loop, d, loop_id, _many_steps(loop_id, steps, big))
    print(f"\nconsole: wrote {steps} steps through the committer in {time.monotonic() - t0:.1f} s")
    # The console's index has them all before the page is opened.
    wait_until(lambda: d.api(f"/api/loops/{loop_id}").get("loop", {}).get("events") == steps + 3, timeout=30)

    times = []
    for _ in range(2):  # the second opening is warm (the browser cached the script)
        open_loop(browser, f"{d.console_url}loops/{loop_id}")
        times.append(browser.execute_script("return window.lwFirstRender"))
    print(f"console: 10,000-step loop, time to first render {times[0]:.0f} ms cold, {times[1]:.0f} ms warm")
    assert max(times) < 1000
    shown = len(browser.find_elements(By.CSS_SELECTOR, "#timeline .ev"))
    assert 0 < shown <= 200

    # The last step's 50,000-character result is cut, with a control that shows it all.
    last = browser.find_elements(By.CSS_SELECTOR, "#timeline .ev-StepDone")[-1]
    assert len(last.find_element(By.CSS_SELECTOR, "pre.result").get_attribute("textContent")) < 3000
    last.find_element(By.CSS_SELECTOR, "button.expand").click()
    full = wait_until(
        lambda: (
            browser.find_elements(By.CSS_SELECTOR, "#timeline .ev-StepDone")[-1]
            .find_element(By.CSS_SELECTOR, "pre.result")
            .get_attribute("textContent")
            == big
        ),
        what="the whole result",
    )
    assert full

    # Scrolling up loads earlier pages.
    for n in range(3):
        t1 = time.monotonic()
        browser.execute_script("window.scrollTo(0, 0)")
        wait_until(
            lambda n=n: len(browser.find_elements(By.CSS_SELECTOR, "#timeline .ev")) >= shown + 200 * (n + 1),
            what="an earlier page",
        )
        print(f"console: earlier page {n + 1} in {(time.monotonic() - t1) * 1000:.0f} ms")
    seqs = browser.execute_script("return window.lwSeqs")
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


def test_thousands_of_loops_are_paged_and_filtered(d: Deployment, browser: WebDriver) -> None:
    n = 2000
    marker = f"model-{uuid.uuid4().hex[:8]}"

    async def write() -> None:
        settings = Settings.from_env({}, nats_urls=(d.nats_url,))
        nc = await connect(settings)
        try:
            client = CommitClient(nc, settings.names, 30)
            limit = anyio.Semaphore(64)

            async def one(k: int) -> None:
                loop_id = str(uuid.uuid4())
                events = [make(LoopStarted, loop_id=loop_id, model=marker, cause=Cause(command_id=str(uuid.uuid4())))]
                if k % 2:
                    events.append(make(LoopClosed, loop_id=loop_id, cause=Cause(command_id=str(uuid.uuid4()))))
                async with limit:
                    await client.commit(loop_id, 0, events)

            async with anyio.create_task_group() as tg:
                for k in range(n):
                    tg.start_soon(one, k)
        finally:
            await nc.close()

    anyio.run(write)
    wait_until(lambda: d.api(f"/api/loops?q={marker}&size=1")["total"] == n, timeout=30, what="the index")
    browser.get(d.console_url)
    wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="the loops page")
    first = browser.execute_script("return window.lwFirstRender")
    print(f"\nconsole: loops page with {n}+ loops, time to first render {first:.0f} ms")
    assert first < 1000
    assert len(on_page(browser, "#loops tbody tr")) == 50
    browser.find_element(By.ID, "f-text").send_keys(marker)
    Select(browser.find_element(By.ID, "f-state")).select_by_value("closed")

    def page(n: int) -> list[dict[str, str]] | None:
        """Page ``n`` of the filtered list once the page shows it whole (the table and its page info
        are read in one script each; both are re-rendered as the filter and the index change)."""
        if f"page {n} of 20 · 1000 loop(s)" not in text_now(browser, "#page-info"):
            return None
        rows = on_page(browser, "#loops tbody tr", "data-loop")
        whole = len(rows) == 50 and all("closed" in r["text"] and marker in r["text"] for r in rows)
        return rows if whole and f"page {n} of 20" in text_now(browser, "#page-info") else None

    first_page = {r["data-loop"] for r in wait_until(lambda: page(1), what="the filtered first page")}
    browser.find_element(By.ID, "next").click()
    second_page = {r["data-loop"] for r in wait_until(lambda: page(2), what="the next page")}
    assert len(first_page) == len(second_page) == 50 and not first_page & second_page
