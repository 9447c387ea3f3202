"""The page for everyone: axe-core finds no serious or critical problem in any of its states, it
works from the keyboard alone, and it is usable on a 390 x 844 phone screen."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.common.keys import Keys

from tests.browser.conftest import AXE, AXE_VERSION, LONG_ANSWER, Page

pytestmark = pytest.mark.browser
BLOCKING = {"serious", "critical"}


def blocking(violations: list[dict[str, Any]]) -> list[str]:
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in violations
        if v.get("impact") in BLOCKING
    ]


def test_axe_finds_no_serious_problem_in_any_state(page: Page) -> None:
    assert AXE.read_text(encoding="utf-8").startswith(f"/*! axe v{AXE_VERSION}\n")  # the vendored one
    found = {"start": page.open().axe("start")}
    page.choose_example("count.png")
    page.ask("Is the pink cross above or below the cyan star?")
    page.wait_turn(0)
    page.el(".stages summary").click()
    found["answered"] = page.axe("answered")
    page.el("#status-toggle").click()
    page.wait(lambda: "Recent latency" in page.text("#status-body"), "the status view")
    found["status"] = page.axe("status")
    page.el("#key-button").click()
    found["key dialog"] = page.axe("key-dialog")
    page.el("#key-cancel").click()
    problems = {state: blocking(violations) for state, violations in found.items()}
    assert problems == {state: [] for state in found}


def test_keyboard_alone_asks_and_escape_stops(page: Page) -> None:
    page.open()
    page.el("body").send_keys(Keys.TAB)
    assert page.driver.switch_to.active_element.get_attribute("class") == "skip"
    page.driver.switch_to.active_element.send_keys(Keys.ENTER)
    assert page.driver.switch_to.active_element.get_attribute("id") == "question"
    page.el('.example[data-file="sign.jpg"]').send_keys(Keys.ENTER)
    page.wait(
        lambda: page.driver.switch_to.active_element.get_attribute("id") == "question",
        "focus on the question",
    )
    page.driver.switch_to.active_element.send_keys("Which character is shown?", Keys.ENTER)
    page.wait_turn(0)
    page.el(".options summary").send_keys(Keys.ENTER)
    page.el("#max-tokens").send_keys(Keys.CONTROL, "a")
    page.el("#max-tokens").send_keys(str(LONG_ANSWER))
    page.el("#ignore-eos").send_keys(Keys.SPACE)
    page.el("#question").send_keys("And what colour is the star?", Keys.ENTER)
    page.wait(
        lambda: len(page.all("#thread .turn")) == 2 and page.turn(1).get_attribute("data-token-events"),
        "tokens",
    )
    page.el("#question").send_keys(Keys.ESCAPE)
    page.wait_turn(1, ("stopped",))


def test_usable_on_a_390x844_phone(page: Page) -> None:
    page.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True},
    )
    page.open().choose_example("shapes.png")
    page.ask("Where is the square?")
    page.wait_turn(0)
    page.driver.execute_script("document.getElementById('ask').scrollIntoView({block: 'end'})")
    size = page.driver.execute_script(
        "return [document.documentElement.scrollWidth, innerWidth, getComputedStyle(document.body).fontSize]"
    )
    assert size[0] <= size[1] == 390 and size[2] == "16px"  # nothing wider than the screen; readable text
    for control in ("#question", "#send", "#stop"):
        box = page.el(control).rect
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390 and box["height"] >= 44, (control, box)
    assert page.el("#thread .answer").is_displayed()
    page.shot("phone-390x844")
