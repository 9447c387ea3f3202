"""``WS /v1/chat/ws``: submit and stream in one connection; errors keep it open; the page."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import redis
from websockets.asyncio.client import ClientConnection, connect

from tests.gateway.workerside import run_job
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack, wait_for

JPEG = image_bytes("JPEG", (90, 90), seed=33)
DATA_URL = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


async def until_end(ws: ClientConnection) -> list[dict[str, Any]]:
    messages = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        messages.append(message)
        if message["type"] in ("done", "error") or message.get("status") in (
            "cancelled",
            "expired",
            "failed",
        ):
            return messages


async def test_two_turns_in_one_connection(gateway: ServiceStack, r: redis.Redis) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Colour?", "image": DATA_URL, "use_cache": False}))
        accepted = json.loads(await ws.recv())
        assert accepted["type"] == "accepted"
        run_job(r, gateway.keys, accepted["id"], ["Pur", "ple"])
        events = await until_end(ws)
        assert "".join(e.get("text", "") for e in events if e["type"] == "token") == "Purple"
        assert events[-1]["type"] == "done" and all("id" in e for e in events)

        await ws.send(
            json.dumps({"prompt": "Sure?", "session_id": accepted["session_id"], "use_cache": False})
        )
        second = json.loads(await ws.recv())
        assert second["type"] == "accepted" and second["session_id"] == accepted["session_id"]
        run_job(r, gateway.keys, second["id"], ["Yes"])
        assert (await until_end(ws))[-1]["final_text"] == "Yes"


async def test_errors_keep_connection_open(gateway: ServiceStack) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Colour?", "session_id": "no-such-session"}))
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["status"] == 404 and "not found" in error["error"]
        await ws.send(json.dumps({"prompt": "Colour?", "image": "data:image/jpeg;base64,!!"}))
        assert json.loads(await ws.recv())["status"] == 400
        await ws.send(json.dumps({"image": DATA_URL}))
        assert json.loads(await ws.recv())["status"] == 422


async def test_cancel_message_and_disconnect(gateway: ServiceStack, r: redis.Redis) -> None:
    async with connect(f"{gateway.ws_url}/v1/chat/ws") as ws:
        await ws.send(json.dumps({"prompt": "Colour?", "image": DATA_URL, "use_cache": False}))
        accepted = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "cancel"}))
        events = await until_end(ws)
        assert events[-1]["status"] == "cancelled"
        # Leave in the middle of the next job: it asked (by default here) to be cancelled then.
        await ws.send(json.dumps({"prompt": "Again?", "image": DATA_URL, "use_cache": False}))
        second = json.loads(await ws.recv())
    assert accepted["id"] != second["id"]
    wait_for(lambda: r.get(gateway.keys.job_cancel(second["id"])), 5, what="cancel on disconnect")
