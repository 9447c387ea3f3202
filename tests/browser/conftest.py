"""Browser tests (``make test-browser``): the web page in headless Chromium (Debian's ``chromium``
and ``chromium-driver``, driven by Selenium; nothing is downloaded) against the real stack, with
an API key configured so the page has to ask for it. Screenshots, axe reports and the browser's
console go to ``.artifacts/browser/`` (gitignored)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver import Chrome
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from shared.jobs import JobRecord
from shared.schemas import JobSpec
from tests.support.models import test_model_path
from tests.support.reference import Reference
from tests.support.stack import ServiceStack, running

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "browser"
EXAMPLES = ROOT / "examples"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
AXE_VERSION = "4.14.1"
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
KEY = "browser-test-key"
BUSY_KEY = "busy-browser-key"  # one job at a time: a question while another job runs is refused (429)
FLOWER_URL = "http://127.0.0.1:5555/"
LONG_ANSWER = 1500  # tokens: several seconds of generating, time enough to press Stop
STACK_ENV = {
    "VLMQ_FLOWER_URL": FLOWER_URL,
    "VLMQ_MAX_TOKENS_LIMIT": str(LONG_ANSWER),
    "VLMQ_MAX_IMAGE_BYTES": "1000000",  # a "too large" upload stays small
}


@pytest.fixture(scope="session")
def web_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    logs = tmp_path_factory.mktemp("web-stack")
    keys = logs / "api-keys"
    keys.write_text(f"{KEY} tenant=web admin\n{BUSY_KEY} tenant=busy concurrency=1\n")
    stack = ServiceStack(redis_url, logs, extra_env={**STACK_ENV, "VLMQ_API_KEYS_FILE": str(keys)})
    with running(stack):
        yield stack


@pytest.fixture(scope="session")
def reference() -> Iterator[Reference]:
    ref = Reference(str(test_model_path()))
    yield ref
    ref.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} missing: apt-get install -y chromium chromium-driver (.ci/run does)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="session", autouse=True)
def artifacts() -> Path:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


class Page:
    """The page in the browser, and the stack behind it."""

    def __init__(self, driver: Chrome, stack: ServiceStack, name: str) -> None:
        self.driver, self.stack, self.name = driver, stack, name

    def open(self, key: str | None = KEY) -> Page:
        """Load ``/`` with ``key`` already saved (None: a first visit, nothing saved)."""
        self.driver.get(f"{self.stack.base_url}/static/examples.json")  # same origin: its storage
        self.driver.execute_script(
            "localStorage.clear(); if (arguments[0]) localStorage.setItem('vlmq.apiKey', arguments[0]);", key
        )
        self.driver.get(f"{self.stack.base_url}/")
        self.wait(lambda: len(self.all(".example")) == 3, "the gallery")
        return self

    def el(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, condition: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
        return WebDriverWait(self.driver, timeout_s, poll_frequency=0.05).until(
            lambda _d: condition(), f"waiting for {what}"
        )

    def text(self, css: str) -> str:
        return str(self.el(css).get_attribute("textContent") or "")

    def turn(self, index: int) -> WebElement:
        return self.all("#thread .turn")[index]

    def wait_turn(self, index: int, states: tuple[str, ...] = ("done",)) -> WebElement:
        def ended() -> WebElement | None:
            turns = self.all("#thread .turn")
            return (
                turns[index]
                if len(turns) > index and turns[index].get_attribute("data-state") in states
                else None
            )

        return self.wait(ended, f"turn {index} to be {'/'.join(states)}")

    def choose_example(self, file: str) -> None:
        self.el(f'.example[data-file="{file}"]').click()
        self.wait(lambda: self.el("#preview").get_attribute("alt"), "the preview")

    def ask(self, question: str) -> None:
        box = self.el("#question")
        box.clear()
        box.send_keys(question)
        self.el("#send").click()

    def spec(self, turn: WebElement) -> JobSpec:
        job_id = turn.get_attribute("data-job-id")
        return JobRecord.from_hash(self.stack.redis.hgetall(self.stack.keys.job(str(job_id)))).spec

    def api(self, method: str, path: str, key: str = KEY, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.request(method, f"{self.stack.base_url}{path}", headers=headers, timeout=30, **kwargs)

    def axe(self, state: str) -> list[dict[str, Any]]:
        """axe-core's violations on the page as it is now (the report is saved as an artifact)."""
        self.driver.execute_script(AXE.read_text(encoding="utf-8"))
        report = self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "axe.run(document, {resultTypes: ['violations']})"
            ".then((r) => done(r.violations), (e) => done(String(e)));"
        )
        assert isinstance(report, list), report
        (ARTIFACTS / f"{self.name}-axe-{state}.json").write_text(json.dumps(report, indent=2))
        return report

    def viewport(self, width: int, height: int, mobile: bool = False) -> None:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)

    def shot(self, label: str) -> Path:
        path = ARTIFACTS / f"{self.name}-{label}.png"
        self.driver.save_screenshot(str(path))
        return path

    def console(self) -> list[dict[str, Any]]:
        return list(self.driver.get_log("browser"))


@pytest.fixture
def page(browser: Chrome, web_stack: ServiceStack, request: pytest.FixtureRequest) -> Iterator[Page]:
    view = Page(browser, web_stack, request.node.name)
    view.viewport(1280, 900)
    yield view
    view.shot("end")
    console = view.console()
    (ARTIFACTS / f"{view.name}-console.json").write_text(json.dumps(console, indent=2))
    script_errors = [e for e in console if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert not script_errors, script_errors  # a refused request is a network entry; a script error is a bug
