"""The console's gates in a real browser against ``loopwire up``: the gate inbox with two operators
answering at once, deny with a reason, a reply to a question, and a gate answered elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.system.consolebrowser import (
    ASK,
    COMPUTE,
    DENY,
    LOOPWIRE,
    SCREENSHOT,
    Deployment,
    browser_session,
    committed,
    new_browser,
    open_loop,
    running_deployment,
    start_loop,
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


# --- tests ----------------------------------------------------------------------------------------


def test_gate_inbox_two_operators_one_answer_completes_the_turn(
    d: Deployment, browser: WebDriver, tmp_path: Path
) -> None:
    loop_id = start_loop(d, COMPUTE, policy="calculator=ask")
    second = new_browser()
    try:
        for b, name in ((browser, "alice"), (second, "bob")):
            b.get(d.console_url + "gates")
            op = b.find_element(By.ID, "operator")
            op.clear()
            op.send_keys(name)
        selector = f'.gate-card[data-gate] a[href="/loops/{loop_id}"]'
        for b in (browser, second):
            wait_until(lambda b=b: b.find_elements(By.CSS_SELECTOR, selector), what="the gate in the inbox")
        cards = [
            b.find_element(By.XPATH, f'//a[@href="/loops/{loop_id}"]/ancestor::div[@data-gate]')
            for b in (browser, second)
        ]
        assert "calculator" in cards[0].text and "6*7" in cards[0].text
        wait_until(lambda: second.title.startswith("(1) Gates"), what="the open gate counted in the title")
        # Both operators approve at (nearly) the same moment. Whoever is second either gets the committer's
        # refusal or, if the first answer reached the page before the click, sees the card closed: both
        # say who answered and when.
        clicks = [
            threading.Thread(
                target=b.execute_script,
                args=("arguments[0].click()", c.find_element(By.CSS_SELECTOR, "button.approve")),
            )
            for b, c in zip((browser, second), cards, strict=True)
        ]
        for t in clicks:
            t.start()
        for t in clicks:
            t.join()
        outcomes = [
            wait_until(
                lambda c=c: c.get_attribute("data-answer") not in (None, "pending") and c.get_attribute("data-answer"),
                what="an answer outcome",
            )
            for c in cards
        ]
        assert sorted(outcomes) == ["already_answered", "ok"], outcomes
        loser = cards[outcomes.index("already_answered")]
        winner_name = ("alice", "bob")[outcomes.index("ok")]
        message = loser.find_element(By.CSS_SELECTOR, ".result-msg").text
        assert f"already answered: approve by {winner_name} at " in message, message
    finally:
        second.quit()

    open_loop(browser, f"{d.console_url}loops/{loop_id}")
    wait_until(lambda: committed(browser, "TurnDone"), what="the turn to complete after the approval")
    history = d.history(loop_id)
    resolved = [r["event"] for r in history if r["event"]["type"] == "GateResolved"]
    assert len(resolved) == 1 and resolved[0]["action"] == "approve" and resolved[0]["resolver"] == winner_name
    assert [r["event"]["type"] for r in history][-2:] == ["TurnDone", "LoopIdle"]
    # The tool call expands to its input and result; this page is the README's screenshot.
    tool = browser.find_element(By.CSS_SELECTOR, "#timeline details.tool")
    tool.find_element(By.TAG_NAME, "summary").click()
    assert "42" in tool.find_element(By.CSS_SELECTOR, "pre.result").text
    # The page (the README's screenshot) names the model, not where the test kept its script.
    page_text = text_now(browser, "body")
    assert "scripted:" in page_text and str(d.data_dir) not in page_text and "/tmp/" not in page_text
    browser.execute_script("window.scrollTo(0, 0)")
    shot = SCREENSHOT if os.environ.get("LW_UPDATE_SCREENSHOT") == "1" else tmp_path / "console.png"
    assert browser.save_screenshot(str(shot))


def test_deny_with_a_reason_and_reply_to_a_question_on_the_loop_page(d: Deployment, browser: WebDriver) -> None:
    denied = start_loop(d, DENY, policy="calculator=ask")
    open_loop(browser, f"{d.console_url}loops/{denied}")
    card = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#loop-gates .gate-card"), what="the gate")[0]
    assert "1/0" in card.text
    card.find_element(By.CSS_SELECTOR, "input.deny-reason").send_keys("not today")
    card.find_element(By.CSS_SELECTOR, "button.deny").click()
    wait_until(lambda: committed(browser, "TurnDone"), what="the turn after the denial")
    resolved = [r["event"] for r in d.history(denied) if r["event"]["type"] == "GateResolved"]
    assert [(e["action"], e["reason"]) for e in resolved] == [("deny", "not today")]
    assert "not today" in browser.find_element(By.CSS_SELECTOR, "#timeline .ev-GateResolved").text

    asked = start_loop(d, ASK)
    open_loop(browser, f"{d.console_url}loops/{asked}")
    card = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#loop-gates .gate-card"), what="the question")[0]
    assert "Which colour?" in card.text
    assert [b.text for b in card.find_elements(By.CSS_SELECTOR, "button.choice")] == ["red", "blue"]
    card.find_element(By.CSS_SELECTOR, "button.reply").click()  # an empty answer is not sent
    assert "write an answer first" in card.text
    card.find_element(By.CSS_SELECTOR, "input.reply-text").send_keys("green")
    card.find_element(By.CSS_SELECTOR, "button.reply").click()
    wait_until(lambda: committed(browser, "TurnDone"), what="the turn after the reply")
    results = [
        m
        for r in d.history(asked)
        if r["event"]["type"] == "StepDone"
        for m in r["event"]["messages"]
        if m["role"] == "tool"
    ]
    assert [m["blocks"][0]["text"] for m in results] == ["green"]

    # A gate answered elsewhere (the CLI) while the page shows it: the card stays and says who took it.
    third = start_loop(d, COMPUTE, policy="calculator=ask")
    open_loop(browser, f"{d.console_url}loops/{third}")
    card = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#loop-gates .gate-card"), what="the gate")[0]
    gate_id = card.get_attribute("data-gate")
    cli = subprocess.run(
        [LOOPWIRE, "approve", gate_id, "--loop", third], env=d.env(), capture_output=True, text=True, timeout=30
    )
    assert cli.returncode == 0, cli.stderr
    wait_until(lambda: card.get_attribute("data-answer") == "already_answered", what="the card closed")
    assert f"gate {gate_id} was already answered: approve by operator at " in card.text
    assert all(not b.is_enabled() for b in card.find_elements(By.TAG_NAME, "button"))
