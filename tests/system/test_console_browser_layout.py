"""The console's layout in a real browser (Debian's chromium + chromium-driver) against ``loopwire up``:
a long loop's controls stay in view, "fork from here" buttons sit inside their cards, the Tools page
shows each tool's safety annotations, and a policy naming no tool is refused on the page."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.system.consolebrowser import (
    LONG,
    LOOPWIRE,
    Deployment,
    browser_session,
    on_page,
    open_loop,
    running_deployment,
    start_loop,
    text_now,
    wait_until,
)

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with running_deployment(tmp_path_factory.mktemp("console-layout")) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with browser_session() as driver:
        yield driver


@pytest.fixture(scope="module")
def long_loop(d: Deployment) -> str:
    """A loop of ten tool steps: a timeline several screens long."""
    loop_id = start_loop(d, LONG)
    wait_until(lambda: "TurnDone" in [r["event"]["type"] for r in d.history(loop_id)], 60, "the long turn")
    return loop_id


def loop_count(d: Deployment) -> int:
    done = subprocess.run([LOOPWIRE, "loops", "--json"], env=d.env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return len(done.stdout.splitlines())


def rect(browser: WebDriver, selector: str) -> dict[str, float]:
    found: dict[str, float] = browser.execute_script(
        "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
        "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: window.innerHeight};",
        selector,
    )
    return found


def in_view(r: dict[str, float]) -> bool:
    return r["top"] >= 0 and r["bottom"] <= r["height"]


def test_a_long_loop_keeps_its_controls_in_view(d: Deployment, browser: WebDriver, long_loop: str) -> None:
    open_loop(browser, f"{d.console_url}loops/{long_loop}")
    tall = browser.execute_script("return document.documentElement.scrollHeight / window.innerHeight")
    assert tall > 1.5, f"the timeline is only {tall:.1f} screens long"
    # The page opens at the loop's end; the side column with its controls is in view there, halfway
    # up and at the top.
    assert browser.execute_script("return window.scrollY") > 0
    for where in ("end", "middle", "top"):
        if where == "middle":
            browser.execute_script("window.scrollTo(0, document.documentElement.scrollHeight / 2)")
        elif where == "top":
            browser.execute_script("window.scrollTo(0, 0)")
        for control in ("#send", "#interrupt", "#close", "#f-model"):
            r = rect(browser, control)
            assert in_view(r), (where, control, r)
    assert browser.find_element(By.ID, "send").is_displayed()


def test_fork_buttons_lie_within_their_cards(d: Deployment, browser: WebDriver, long_loop: str) -> None:
    open_loop(browser, f"{d.console_url}loops/{long_loop}")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#timeline .ev > button.fork"), what="fork buttons")
    boxes: list[dict[str, Any]] = browser.execute_script(
        """return Array.from(document.querySelectorAll('#timeline .ev > button.fork')).map((b) => {
            const r = b.getBoundingClientRect(), c = b.parentElement.getBoundingClientRect();
            return {seq: b.parentElement.dataset.seq, button: [r.top, r.bottom, r.left, r.right],
                    card: [c.top, c.bottom, c.left, c.right]};
        });"""
    )
    assert len(boxes) >= 10  # the input, every tool step, the turn's end
    for box in boxes:
        (bt, bb, bl, br), (ct, cb, cl, cr) = box["button"], box["card"]
        assert ct <= bt and bb <= cb and cl <= bl and br <= cr, box


def test_the_tools_page_shows_each_tool_s_safety_annotations(d: Deployment, browser: WebDriver) -> None:
    listed = subprocess.run([LOOPWIRE, "tools", "--json"], env=d.env(), capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    marks = ("read_only", "idempotent", "destructive", "open_world")
    expected = {
        t["name"]: ", ".join(m.replace("_", "-") for m in marks if t[m]) or "-"
        for t in map(json.loads, listed.stdout.splitlines())
    }
    assert any(v != "-" for v in expected.values()), expected
    browser.get(f"{d.console_url}tools")
    headers = [h["text"] for h in on_page(browser, "#tools thead th")]
    assert "safety" in headers, headers
    column = headers.index("safety")

    def shown() -> dict[str, str] | None:
        rows: list[list[str]] = browser.execute_script(
            "return Array.from(document.querySelectorAll('#tools tbody tr'))"
            ".map((tr) => Array.from(tr.children).map((td) => td.innerText.trim()));"
        )
        table = {r[0]: r[column] for r in rows if len(r) > column}
        return table if set(table) == set(expected) else None

    assert wait_until(shown, what="every live tool in the table") == expected


def test_a_policy_naming_no_tool_is_refused_on_the_page(d: Deployment, browser: WebDriver) -> None:
    doc = d.api("/api/loops", {"policy": "calculater=ask"})
    assert not doc["ok"] and doc["error"]["kind"] == "invalid", doc
    assert doc["error"]["message"] == "policy: 'calculater' is not a tool of the loop (did you mean calculator?)"
    before = loop_count(d)
    browser.get(d.console_url)
    wait_until(lambda: browser.find_elements(By.ID, "s-policy"), what="the start form")
    browser.find_element(By.ID, "s-policy").send_keys("calculater=ask")
    browser.find_element(By.ID, "s-input").send_keys("what is 6*7?")
    browser.find_element(By.ID, "s-go").click()
    flash = wait_until(lambda: text_now(browser, "#start-flash"), what="the start's answer")
    assert "did you mean calculator?" in flash and browser.current_url.rstrip("/") == d.console_url.rstrip("/")
    assert loop_count(d) == before  # nothing was started
