"""The operator console in a real browser (Debian's chromium + chromium-driver) against ``loopwire up``.

``loopwire up`` runs a real nats-server and every service as its own process, with a scripted
model (responses chosen by the loop's first input) and the console it starts. Selenium drives the
pages the way an operator would; results are checked against the committed history.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import msgspec
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from shared.natsserver import free_port
from tests.syshelpers import debian_program

pytestmark = pytest.mark.system

LOOPWIRE = shutil.which("loopwire", path=str(Path(sys.executable).parent)) or "loopwire"
CHROMIUM: Final = debian_program("chromium", "chromium")
CHROMEDRIVER: Final = debian_program("chromedriver", "chromium-driver")
# The README's screenshot; rewritten only when LW_UPDATE_SCREENSHOT=1 (a test run leaves the tree clean).
SCREENSHOT: Final = Path(__file__).resolve().parents[2] / "docs" / "console.png"
TOKEN: Final = "test-console-token"
T = TypeVar("T")


def _text(chunks: list[str], delay: float, usage: tuple[int, int] = (12, 30)) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for c in chunks:
        items += [{"sleep": delay}, {"kind": "text", "text": c}]
    items.append({"kind": "usage", "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}})
    items.append({"kind": "finish", "finish_reason": "end_turn"})
    return items


def _call(name: str, args: dict[str, Any], delay: float = 0.0) -> list[dict[str, Any]]:
    head: list[dict[str, Any]] = [{"sleep": delay}] if delay else []
    return [
        *head,
        {"kind": "text", "text": f"Calling {name}."},
        {"kind": "tool_use", "index": 0, "id": "call_{k}", "name": name},
        {"kind": "tool_use", "index": 0, "text": json.dumps(args)},
        {"kind": "usage", "usage": {"input_tokens": 10, "output_tokens": 5}},
        {"kind": "finish", "finish_reason": "tool_use"},
    ]


STREAM: Final = "stream an answer please"
COMPUTE: Final = "what is 6*7?"
SLEEP: Final = "sleep for half a minute"
LONG: Final = "a long computation"
ASK: Final = "ask me something"
DENY: Final = "compute something I will refuse"
STREAM_WORDS: Final = ["The ", "answer ", "streams ", "in ", "word ", "by ", "word ", "and ", "ends ", "here."]
SCRIPT: Final = {
    "responses": ["(no script for this input)"],
    "repeat_last": True,
    "by_first_user_text": {
        STREAM: [_text(STREAM_WORDS, 0.12), _text(["Second ", "answer: ", "got ", "it."], 0.05)],
        COMPUTE: [_call("calculator", {"expression": "6*7"}), _text(["6*7 ", "is ", "42."], 0.02)],
        SLEEP: [_call("sleep", {"seconds": 30}, 1.0), _text(["slept."], 0.01)],
        ASK: [_call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}), _text(["Noted."], 0.01)],
        DENY: [_call("calculator", {"expression": "1/0"}), _text(["Understood."], 0.01)],
        LONG: [*[_call("calculator", {"expression": f"{k}+{k}"}, 0.35) for k in range(10)], _text(["done."], 0.01)],
    },
}


# --- the deployment -----------------------------------------------------------------------------


@dataclass
class Deployment:
    proc: subprocess.Popen[str]
    nats_url: str
    console_url: str
    data_dir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "LW_NATS_URL": self.nats_url, "LW_PREFIX": "lw"}

    def history(self, loop_id: str) -> list[dict[str, Any]]:
        out = subprocess.run(
            [LOOPWIRE, "history", loop_id, "--json"], env=self.env(), capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def api(self, path: str, body: dict[str, Any] | None = None, *, base: str = "", token: str = "") -> Any:
        headers = {"X-Loopwire-Token": token} if token else {}
        url = (base or self.console_url).rstrip("/") + path
        r = httpx.post(url, json=body, headers=headers) if body is not None else httpx.get(url, headers=headers)
        return r.json()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("console")
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    args = [LOOPWIRE, "up", "--port", "0", "--console-port", str(free_port()), "--data-dir", str(tmp / "data")]
    args += ["--model", f"scripted:{script}", "--tools", "calculator,sleep,clock,ask_user"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        text = "".join(lines)
        nats = re.search(r"^NATS URL: (\S+)", text, re.M)
        console = re.search(r"^console:  (http://\S+)", text, re.M)
        assert nats and console, f"loopwire up did not come up:\n{text}"
        yield Deployment(proc, nats.group(1), console.group(1), tmp / "data")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _browser() -> WebDriver:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(a)
    opts.add_argument("--disable-gpu")
    # The driver's path given: Selenium Manager is never run (nothing is downloaded).
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(probe: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except (StaleElementReferenceException, WebDriverException):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or probe}")
        time.sleep(0.03)


def on_page(browser: WebDriver, selector: str, *attributes: str) -> list[dict[str, str]]:
    """What the elements matching ``selector`` show at one instant: their text and ``attributes``,
    read in one script. The page re-renders its tables (the loops, the tools, a lineage) whenever
    what they list changes, so an element found in one WebDriver call may be gone by the next."""
    script = """
        const [selector, names] = arguments;
        return Array.from(document.querySelectorAll(selector)).map((e) => {
            const out = { text: e.innerText };
            for (const name of names) out[name] = e.getAttribute(name) ?? "";
            return out;
        });
    """
    rows: list[dict[str, str]] = browser.execute_script(script, selector, list(attributes))
    return rows


def text_now(browser: WebDriver, selector: str) -> str:
    """The text of the first element matching ``selector`` now ("" when there is none)."""
    found = on_page(browser, selector)
    return found[0]["text"] if found else ""


def committed(browser: WebDriver, event_type: str) -> list[Any]:
    return browser.find_elements(By.CSS_SELECTOR, f"#timeline .ev-{event_type}")


def open_loop(browser: WebDriver, url: str) -> None:
    browser.get(url)
    wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), what="the loop page")


def start_loop(d: Deployment, text: str, **extra: str) -> str:
    doc = d.api("/api/loops", {"input": text, **extra})
    assert doc["ok"], doc
    return str(doc["loop_id"])


def history_types(d: Deployment, loop_id: str) -> list[str]:
    return [r["event"]["type"] for r in d.history(loop_id)]


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

    # The loops page lists it, filterable by state and text.
    browser.get(d.console_url)
    wait_until(lambda: "idle" in text_now(browser, f'tr[data-loop="{loop_id}"]'), what="the row, idle")
    browser.find_element(By.ID, "f-text").send_keys("no loop has this text")
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, f'tr[data-loop="{loop_id}"]'), what="filtered")

    # The tools page lists the live tools with their replicas and arguments.
    browser.get(d.console_url + "tools")
    cells = wait_until(lambda: on_page(browser, 'tr[data-tool="calculator"] td'), what="the calculator's row")
    assert cells[1]["text"] == "1" and "expression: string" in " ".join(c["text"] for c in cells)


def test_gate_inbox_two_operators_one_answer_completes_the_turn(
    d: Deployment, browser: WebDriver, tmp_path: Path
) -> None:
    loop_id = start_loop(d, COMPUTE, policy="calculator=ask")
    second = _browser()
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


def test_a_10000_step_loop_opens_fast_and_scrolls(d: Deployment, browser: WebDriver) -> None:
    import anyio

    from shared.bus import connect
    from shared.client import CommitClient
    from shared.content import AIMessage, TextBlock, ToolUseBlock, Usage, tool_result, user_text
    from shared.events import Cause, InputSubmitted, LoopStarted, StepDone, TurnStarted, make
    from shared.settings import Settings

    loop_id = str(uuid.uuid4())
    steps = 10_000
    big = "x" * 50_000

    def step(turn_id: str, k: int) -> StepDone:
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

    async def write() -> None:
        settings = Settings.from_env({}, nats_urls=(d.nats_url,))
        nc = await connect(settings)
        try:
            client = CommitClient(nc, settings.names, 30)
            cid = str(uuid.uuid4())
            turn = str(uuid.uuid4())
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
            for base in range(0, steps, 250):
                last = (await client.commit(loop_id, last, [step(turn, k) for k in range(base, base + 250)])).last_seq
        finally:
            await nc.close()

    t0 = time.monotonic()
    anyio.run(write)
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
    import anyio

    from shared.bus import connect
    from shared.client import CommitClient
    from shared.events import Cause, LoopClosed, LoopStarted, make
    from shared.settings import Settings

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

    def check(r: httpx.Response, status: int, kind: str, words: str) -> None:
        assert r.status_code == status, r.text
        assert "Traceback" not in r.text
        err = r.json()["error"]
        assert err["kind"] == kind and words in err["message"], err

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

    # A non-loopback console needs a token; with one, requests without it (or with a wrong one) are refused.
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


@pytest.fixture(scope="module")
def d(deployment: Deployment) -> Deployment:
    return deployment


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
