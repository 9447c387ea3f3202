"""The web page's files as the gateway serves them: no inline script or style (the CSP forbids
them), nothing from another origin, every referenced file there, the gallery's examples real.
(How the page behaves in a browser: tests/browser/.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from gateway.guards import CSP
from tinyvlm.examples import QUESTIONS

STATIC = Path(__file__).resolve().parents[2] / "gateway" / "static"


async def test_page_and_its_files_are_served_under_the_csp(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP and "'unsafe-inline'" not in CSP
    html = page.text
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline script"
    assert "<style" not in html and " style=" not in html, "inline style"
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    for path in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
        assert (await client.get(path)).status_code == 200, path
    script = await client.get("/static/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.headers["cache-control"] == "no-cache"


async def test_every_module_import_resolves_and_nothing_comes_from_elsewhere() -> None:
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?:src|href|url\()\s*=?\s*[\"']?https?://", text), f"{path.name} loads a URL"
        assert "innerHTML" not in text, f"{path.name}: build DOM nodes, never parse HTML"
        for module in re.findall(r'from "\./([^"]+)"', text):
            assert (STATIC / module).is_file(), f"{path.name} imports a missing {module}"


async def test_gallery_examples_are_served_and_are_what_the_model_knows(client: httpx.AsyncClient) -> None:
    examples = (await client.get("/static/examples.json")).json()["examples"]
    for example in examples:
        image = await client.get(f"/examples/{example['file']}")
        assert image.status_code == 200 and image.headers["content-type"].startswith("image/")
    listed = [(e["file"], q, a) for e in examples for q, a in e["questions"]]
    known = [(name, q, a) for name, conversation in QUESTIONS for q, a in conversation]
    assert sorted(listed) == sorted(known)  # tests/services/vlm/test_answers.py checks the answers
    assert (await client.get("/examples/../README.md")).status_code == 404
    assert json.loads((STATIC / "examples.json").read_text())["examples"] == examples
