"""Shared by the console's browser tests: a ``loopwire up`` deployment with a scripted model, and
Selenium helpers (Debian's chromium + chromium-driver).

The scripted model's responses are chosen by the loop's first input (the constants below); each
test module starts its own deployment and browser (see its ``d`` and ``browser`` fixtures).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from shared.natsserver import free_port
from tests.syshelpers import debian_program

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


@contextmanager
def running_deployment(tmp: Path) -> Iterator[Deployment]:
    """``loopwire up`` (every service, the scripted model, the console) with its data under ``tmp``."""
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


def new_browser() -> WebDriver:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(a)
    opts.add_argument("--disable-gpu")
    # The driver's path given: Selenium Manager is never run (nothing is downloaded).
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


@contextmanager
def browser_session() -> Iterator[WebDriver]:
    driver = new_browser()
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
