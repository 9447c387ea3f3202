"""The web page in headless Chromium against the real stack: the key, an example asked and followed
up (the streamed answer is the engine's own for that request), Stop during a long answer, a
dropped image and New image, the server's errors, the status view."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.browser.conftest import BUSY_KEY, EXAMPLES, FLOWER_URL, KEY, LONG_ANSWER, Page
from tests.support.reference import Reference

pytestmark = pytest.mark.browser


def answer_of(page: Page, index: int) -> str:
    return str(page.turn(index).find_element(By.CSS_SELECTOR, ".answer").get_attribute("textContent"))


def dialog_open(page: Page) -> bool:
    return page.el("#key-dialog").get_attribute("open") is not None


def test_the_key_is_asked_for_on_a_401_and_kept(page: Page, reference: Reference) -> None:
    page.open(key=None)  # a first visit: the page's first request gets a 401
    page.wait(lambda: dialog_open(page), "the key dialog")
    assert "missing API key" in page.text("#key-reason")
    page.el("#key-input").send_keys(KEY)
    page.el("#key-save").click()
    page.wait(lambda: not dialog_open(page), "the dialog to close")
    assert page.driver.execute_script("return localStorage.getItem('vlmq.apiKey')") == KEY
    page.driver.refresh()  # kept: not asked again
    page.wait(lambda: len(page.all(".example")) == 3, "the gallery")
    assert not dialog_open(page)
    # A wrong key saved: a question gets the server's message, and goes through with the right key.
    page.open(key="wrong-key")
    page.wait(lambda: dialog_open(page), "the key dialog")
    page.el("#key-cancel").click()
    page.choose_example("sign.jpg")
    page.ask("What colour is the star?")
    page.wait(
        lambda: dialog_open(page) and "invalid API key" in page.text("#key-reason"), "the server's message"
    )
    page.el("#key-input").clear()
    page.el("#key-input").send_keys(KEY)
    page.el("#key-save").click()
    page.wait_turn(0)
    assert answer_of(page, 0) == reference.answer(
        page.spec(page.turn(0)), (EXAMPLES / "sign.jpg").read_bytes()
    )


def test_an_example_streams_the_models_answer_then_a_follow_up(page: Page, reference: Reference) -> None:
    page.open().choose_example("shapes.png")
    suggestions = page.all(".suggestion")
    assert [s.text for s in suggestions][:3] == [
        "What colour is the circle?",
        "And its size?",
        "Where is it?",
    ]
    suggestions[0].click()
    first = page.wait_turn(0)
    image = (EXAMPLES / "shapes.png").read_bytes()
    spec = page.spec(first)
    assert answer_of(page, 0) == reference.answer(spec, image) == "red"
    assert int(first.get_attribute("data-token-events") or 0) >= 1  # it came as token events
    summary = first.find_element(By.CSS_SELECTOR, ".summary").text
    assert "TTFT" in summary and "tokens/s" in summary
    stages = first.find_elements(By.CSS_SELECTOR, ".stages th")
    assert [s.get_attribute("textContent") for s in stages][:3] == ["queue", "decode", "wait"]
    page.ask("And its size?")
    page.wait_turn(1)
    follow_up = page.spec(page.turn(1))
    assert follow_up.conversation_id == spec.conversation_id
    assert [t.text for t in follow_up.messages] == ["What colour is the circle?", "red", "And its size?"]
    assert answer_of(page, 1) == reference.answer(follow_up, image) == "big"
    page.driver.execute_script("scrollTo(0, 0)")
    page.shot("answered")


def test_stop_cancels_a_long_answer(page: Page) -> None:
    page.open().choose_example("count.png")
    page.el(".options summary").click()
    for field in ("#max-tokens", "#min-tokens"):  # min = max: no end of answer before the last token
        page.el(field).clear()
        page.el(field).send_keys(str(LONG_ANSWER))
    page.ask("How many stars are there?")
    page.wait(lambda: len(page.all("#thread .turn")) == 1 and answer_of(page, 0), "the first tokens")
    page.el("#stop").click()
    turn = page.wait_turn(0, ("stopped",))
    job = page.api("GET", f"/v1/jobs/{turn.get_attribute('data-job-id')}").json()
    assert job["status"] == "cancelled" and job["usage"]["completion_tokens"] < LONG_ANSWER
    assert answer_of(page, 0) == job["text"]  # every token streamed, none twice
    assert "Stopped" in turn.text and page.el("#send").is_enabled() and not page.el("#stop").is_enabled()


def test_a_dropped_image_is_asked_about_and_new_image_starts_over(page: Page, reference: Reference) -> None:
    page.open()
    page.driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch('/examples/sign.jpg').then((r) => r.blob()).then((blob) => {
          const data = new DataTransfer();
          data.items.add(new File([blob], 'dropped.jpg', {type: blob.type}));
          const zone = document.getElementById('drop');
          for (const type of ['dragover', 'drop']) {
            zone.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
          }
          done();
        });"""
    )
    page.wait(lambda: "dropped.jpg" in page.text("#image-name"), "the dropped image")
    page.ask("What is written in the picture?")
    page.wait_turn(0)
    assert answer_of(page, 0) == reference.answer(
        page.spec(page.turn(0)), (EXAMPLES / "sign.jpg").read_bytes()
    )
    page.el("#new-image").click()
    assert page.all("#thread .turn") == [] and not page.el("#preview").is_displayed()
    assert page.driver.switch_to.active_element.get_attribute("id") == "file"


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b"just some text, not an image", "Not an image this service reads"),
        (os.urandom(1_200_000), "Too large"),
    ],
    ids=["not-an-image", "too-large"],
)
def test_a_refused_upload_shows_the_servers_message(
    page: Page, tmp_path: Path, content: bytes, kind: str
) -> None:
    upload = tmp_path / "upload.png"
    upload.write_bytes(content)
    page.open()
    page.el("#file").send_keys(str(upload))
    page.wait(lambda: "upload.png" in page.text("#image-name"), "the chosen file")
    page.ask("What is it?")
    alert = page.wait(lambda: page.el("#error").is_displayed() and page.el("#error"), "the error")
    files = {"image": ("upload.png", content, "image/png")}
    server = page.api("POST", "/v1/jobs", data={"prompt": "What is it?"}, files=files)
    assert server.status_code in (413, 415)
    assert alert.text == f"{kind}: {server.json()['error']['message']}"
    assert page.all("#thread .turn") == [] and page.el("#question").get_attribute("value") == "What is it?"


def test_over_its_limit_the_page_says_the_service_is_busy(page: Page) -> None:
    page.open(key=BUSY_KEY).choose_example("shapes.png")
    files = {"image": ("shapes.png", (EXAMPLES / "shapes.png").read_bytes(), "image/png")}
    long = {"prompt": "How many shapes are there?", "max_tokens": LONG_ANSWER, "min_tokens": LONG_ANSWER}
    held = page.api("POST", "/v1/jobs", key=BUSY_KEY, data=long, files=files)  # the key's one job
    assert held.status_code == 202, held.text
    page.ask("Where is the square?")
    alert = page.wait(lambda: page.el("#error").is_displayed() and page.el("#error"), "the error")
    server = page.api("POST", "/v1/jobs", key=BUSY_KEY, data={"prompt": "Where is the square?"}, files=files)
    page.api("DELETE", f"/v1/jobs/{held.json()['id']}", key=BUSY_KEY)
    assert server.status_code == 429
    message = server.json()["error"]["message"]
    assert alert.text.startswith("The service is busy") and alert.text.endswith(f": {message}"), alert.text
    assert page.all("#thread .turn") == []  # the refused question left no turn behind


def test_status_view_shows_the_worker_and_links_flower(page: Page) -> None:
    page.open()
    toggle = page.el("#status-toggle")
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"
    worker = f"inference-{page.stack.key_prefix}"
    page.wait(lambda: worker in page.text("#status-body"), "the worker in the status view")
    body = page.text("#status-body")
    for words in ("healthy", "inference backlog", "Cache hit ratios", "Recent latency"):
        assert words in body
    assert page.el("#status-body a").get_attribute("href") == FLOWER_URL
    page.shot("status")
