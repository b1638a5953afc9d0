"""The operator console in a real browser (Debian's chromium + chromium-driver) against ``loopwire up``:
starting and steering a loop from its page, a console restart, forks and lineage, and bad input.

``loopwire up`` runs a real nats-server and every service as its own process, with a scripted
model (responses chosen by the loop's first input) and the console it starts. Selenium drives the
pages the way an operator would; results are checked against the committed history. Gates are in
test_console_browser_gates.py, large histories and many loops in test_console_browser_scale.py.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from shared.natsserver import free_port
from tests.system.consolebrowser import (
    COMPUTE,
    LONG,
    LOOPWIRE,
    SLEEP,
    STREAM,
    STREAM_WORDS,
    TOKEN,
    Deployment,
    browser_session,
    committed,
    history_types,
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
    with running_deployment(tmp_path_factory.mktemp("console")) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with browser_session() as driver:
        yield driver


# --- tests ----------------------------------------------------------------------------------------


def test_start_and_send_from_the_page_streams_tokens_then_the_answer(d: Deployment, browser: WebDriver) -> None:
    browser.get(d.console_url)
    browser.find_element(By.ID, "s-input").send_keys(STREAM)
    browser.find_element(By.ID, "s-go").click()
    wait_until(lambda: "/loops/" in browser.current_url, what="the new loop's page")
    loop_id = browser.current_url.rstrip("/").split("/")[-1]
    wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))

    # Tokens show up in the running step before the step is committed.
    partial = wait_until(lambda: browser.find_element(By.ID, "live-text").text, what="streamed tokens")
    assert not committed(browser, "TurnDone"), "the turn ended before any token was seen streaming"
    # (live events are not replayed: tokens streamed before the page subscribed are not shown)
    assert partial.strip() in "".join(STREAM_WORDS) and len(partial.strip()) < len("".join(STREAM_WORDS))
    wait_until(lambda: committed(browser, "TurnDone"), what="the committed answer")
    answer = browser.find_element(By.CSS_SELECTOR, "#timeline .ev-StepDone .assistant-text").text
    assert answer == "".join(STREAM_WORDS)
    assert browser.find_element(By.ID, "live").get_attribute("hidden") is not None  # the running step is gone

    # A second input sent from the page.
    browser.find_element(By.ID, "input-text").send_keys("and again")
    browser.find_element(By.ID, "send").click()
    wait_until(lambda: len(committed(browser, "TurnDone")) == 2, what="the second turn")
    texts = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#timeline .assistant-text")]
    assert texts[-1] == "Second answer: got it."
    assert history_types(d, loop_id).count("TurnDone") == 2

    # Opened again: the server checked the stored history against its digest chain (the mark).
    open_loop(browser, browser.current_url)
    mark = wait_until(lambda: on_page(browser, "#loop-verified:not([hidden])"), what="the verified mark")
    assert mark[0]["text"].startswith("✓ verified (") and "records chained" in mark[0]["text"], mark
    assert browser.find_element(By.ID, "loop-verified").get_attribute("data-verified") == "true"

    # The loops page lists it, filterable by state and text.
    browser.get(d.console_url)
    wait_until(lambda: "idle" in text_now(browser, f'tr[data-loop="{loop_id}"]'), what="the row, idle")
    browser.find_element(By.ID, "f-text").send_keys("no loop has this text")
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, f'tr[data-loop="{loop_id}"]'), what="filtered")

    # The tools page lists the live tools with their replicas and arguments.
    browser.get(d.console_url + "tools")
    cells = wait_until(lambda: on_page(browser, 'tr[data-tool="calculator"] td'), what="the calculator's row")
    assert cells[1]["text"] == "1" and "expression: string" in " ".join(c["text"] for c in cells)


def test_interrupt_a_30s_sleep_from_the_page(d: Deployment, browser: WebDriver) -> None:
    loop_id = start_loop(d, SLEEP)
    open_loop(browser, f"{d.console_url}loops/{loop_id}")
    wait_until(lambda: "sleep" in browser.find_element(By.ID, "live-tools").text, what="the sleep call running live")
    t0 = time.monotonic()
    browser.find_element(By.ID, "interrupt").click()
    wait_until(lambda: committed(browser, "TurnInterrupted"), timeout=5, what="the interrupted turn")
    elapsed = time.monotonic() - t0
    print(f"\nconsole: interrupt click to TurnInterrupted on the page in {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0
    assert "TurnInterrupted" in history_types(d, loop_id)


def test_console_restart_resumes_with_every_event_exactly_once(d: Deployment, browser: WebDriver) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**d.env(), "LW_CONSOLE_TOKEN": TOKEN}
    cmd = [LOOPWIRE, "console", "--port", str(port)]

    def start() -> subprocess.Popen[str]:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        for line in p.stdout:
            if line.strip() == "READY":
                return p
        raise AssertionError(f"the console did not start: {p.wait()}")

    console = start()
    try:
        doc = d.api("/api/loops", {"input": LONG}, base=base, token=TOKEN)
        assert doc["ok"], doc
        loop_id = doc["loop_id"]
        open_loop(browser, f"{base}/loops/{loop_id}#token={TOKEN}")
        wait_until(lambda: committed(browser, "StepDone"), what="a first step")
        console.send_signal(signal.SIGTERM)
        assert console.wait(timeout=15) == 0
        wait_until(lambda: browser.execute_script("return document.body.dataset.live === '0'"), what="the drop")
        time.sleep(0.7)  # steps keep being committed while no console runs
        console = start()
        wait_until(lambda: committed(browser, "TurnDone"), timeout=20, what="the end of the turn after the restart")
    finally:
        console.send_signal(signal.SIGTERM)
        console.wait(timeout=15)
    shown = browser.execute_script("return window.lwSeqs")
    repeats = browser.execute_script("return window.lwRepeats")
    history = [r["seq"] for r in d.history(loop_id)]
    rendered = [int(e["data-seq"]) for e in on_page(browser, "#timeline .ev", "data-seq")]
    assert repeats == 0
    assert shown == history == rendered


def check(r: httpx.Response, status: int, kind: str, words: str) -> None:
    """``r`` is the JSON error ``kind`` with ``status``, its message says ``words``, and no stack trace."""
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    err = r.json()["error"]
    assert err["kind"] == kind and words in err["message"], err


def _check_a_non_loopback_console(d: Deployment, loop_id: str) -> None:
    """A non-loopback console needs a token; with one, requests without it (or with a wrong one) are refused."""
    env = {**d.env(), "LW_CONSOLE_TOKEN": ""}
    refused = subprocess.run(
        [LOOPWIRE, "console", "--host", "0.0.0.0", "--port", str(free_port())], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 1 and "needs a token: set LW_CONSOLE_TOKEN" in refused.stderr
    port = free_port()
    p = subprocess.Popen(
        [LOOPWIRE, "console", "--host", "0.0.0.0", "--port", str(port)],
        env={**d.env(), "LW_CONSOLE_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert p.stdout is not None
        assert any(line.strip() == "READY" for line in p.stdout)
        t = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        check(t.get("/api/loops"), 401, "unauthorized", "token is missing")
        check(t.get("/api/loops", headers={"X-Loopwire-Token": "wrong"}), 401, "unauthorized", "token is incorrect")
        check(
            t.post(f"/api/loops/{loop_id}/close", headers={"X-Loopwire-Token": "x"}), 401, "unauthorized", "incorrect"
        )
        assert t.get("/api/loops", headers={"X-Loopwire-Token": TOKEN}).json()["ok"]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=15)


def test_bad_input_gets_clear_errors_never_a_stack_trace(d: Deployment, browser: WebDriver) -> None:
    unknown = str(uuid.uuid4())
    browser.get(f"{d.console_url}loops/{unknown}")
    assert f"There is no loop {unknown}" in browser.find_element(By.ID, "error-message").text
    browser.get(f"{d.console_url}loops/not-a-uuid")
    assert "is not a loop id" in browser.find_element(By.ID, "error-message").text
    browser.get(f"{d.console_url}no/such/page")
    assert "no such page" in browser.find_element(By.ID, "error-message").text

    c = httpx.Client(base_url=d.console_url.rstrip("/"))
    loop_id = start_loop(d, "(anything)")

    check(c.get(f"/api/loops/{unknown}"), 404, "not_found", "no loop")
    check(c.get("/api/loops/nope"), 400, "invalid", "not a lowercase UUID")
    check(c.get(f"/api/loops/{loop_id}/events?before=x"), 400, "invalid", "before must be an integer")
    check(c.get("/api/loops?state=sleeping"), 400, "invalid", "state must be one of")
    check(
        c.post(f"/api/loops/{loop_id}/answer", json={"gate_id": unknown, "action": "approve"}),
        404,
        "not_found",
        "no gate",
    )
    check(
        c.post(f"/api/loops/{loop_id}/answer", json={"gate_id": "g1", "action": "approve"}), 400, "invalid", "gate id"
    )
    check(c.post(f"/api/loops/{unknown}/input", json={"text": "hi"}), 404, "not_found", "no loop")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    check(c.post(f"/api/loops/{loop_id}/input", content=b"text=%zz&&=", headers=form), 400, "invalid", "malformed")
    check(c.post(f"/api/loops/{loop_id}/input", content=b"text=", headers=form), 400, "invalid", "text is required")
    check(
        c.post(f"/api/loops/{loop_id}/input", content=b"[1,2", headers={"Content-Type": "application/json"}),
        400,
        "invalid",
        "not valid JSON",
    )
    check(c.post(f"/api/loops/{loop_id}/input", json=["text"]), 400, "invalid", "JSON object")
    check(c.post(f"/api/loops/{loop_id}/input", json={"text": "hi", "command_id": "7"}), 400, "invalid", "command_id")
    check(c.post("/api/loops", json={"policy": "calculator=maybe"}), 400, "invalid", "policy wants")
    check(
        c.post(f"/api/loops/{loop_id}/interrupt", headers={"Origin": "http://evil.example"}),
        403,
        "forbidden",
        "cross-site",
    )
    check(
        c.post(f"/api/loops/{loop_id}/close", headers={"Sec-Fetch-Site": "cross-site"}), 403, "forbidden", "cross-site"
    )
    check(c.get("/api/loops", headers={"Host": "rebound.example:80"}), 403, "forbidden", "answers only to")
    check(c.get("/api/nothing/here"), 404, "not_found", "no such page")
    check(c.delete(f"/api/loops/{loop_id}"), 405, "invalid", "method not allowed")
    assert c.post(f"/api/loops/{loop_id}/input", json={"text": "fine"}).json()["ok"]

    _check_a_non_loopback_console(d, loop_id)


def test_fork_from_a_point_of_the_timeline_and_see_the_lineage(d: Deployment, browser: WebDriver) -> None:
    loop_id = start_loop(d, COMPUTE)
    open_loop(browser, f"{d.console_url}loops/{loop_id}")
    wait_until(lambda: committed(browser, "TurnDone"), what="the answer")

    # "fork from here" on exactly the valid points: the input, the tool step, the turn's end.
    # (the buttons follow the loop: the answer's StepDone is a point until its TurnDone is stored)
    def points_now() -> list[dict[str, str]]:
        return on_page(browser, "#timeline .ev:has(> button.fork)", "data-type", "data-seq")

    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: [p["data-type"] for p in points_now()] == ["InputSubmitted", "StepDone", "TurnDone"],
            what="fork buttons",
        )
    points = points_now()
    assert [p["data-type"] for p in points] == ["InputSubmitted", "StepDone", "TurnDone"], points
    at = int(points[-1]["data-seq"])
    browser.find_element(By.CSS_SELECTOR, f'#timeline .ev[data-seq="{at}"] > button.fork').click()
    wait_until(lambda: loop_id not in browser.current_url, what="the fork's page")
    fork_id = browser.current_url.rstrip("/").split("/")[-1]
    wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    wait_until(lambda: f"forked from {loop_id[:8]} at #{at}" in text_now(browser, "#lineage"), what="the lineage")
    types = history_types(d, fork_id)
    assert types[:2] == ["LoopForked", "LoopStarted"] and types.count("TurnDone") == 1
    open_loop(browser, f"{d.console_url}loops/{loop_id}")
    wait_until(lambda: f"fork {fork_id[:8]} at #{at}" in text_now(browser, "#lineage"), what="the fork listed")
