"""The chaos test's clients: submit (retrying until accepted), then follow the job's SSE stream,
dropping the connection now and then and resuming from the last event id, like a browser would."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_S = 0.5
TERMINAL = {"done", "failed", "cancelled", "expired"}


@dataclass
class Job:
    """One accepted job as its client saw it."""

    job_id: str
    image: bytes
    session_id: str
    # (index, tokens, text) of each token event in arrival order (an event may carry several tokens)
    tokens: list[tuple[int, int, str]] = field(default_factory=list)
    final: dict[str, Any] | None = None  # the terminal event
    resumes: int = 0
    # The id of the last event read: kept here, not returned, so a read that fails mid-stream
    # (the gateway lost Redis) resumes after what it did receive instead of receiving it twice.
    last_id: str = "0"


@dataclass
class Load:
    client: httpx.AsyncClient
    rng: random.Random
    accepted: list[Job] = field(default_factory=list)
    refusals: int = 0  # 429/503/connection errors before a 202 (not accepted: no promise made)

    async def submit(self, image: bytes, fmt: str, prompt: str, session_id: str | None) -> Job:
        data = {"prompt": prompt, "max_tokens": "12", "cancel_on_disconnect": "false"}
        if session_id:
            data["session_id"] = session_id
        files = {"image": (f"img.{fmt.lower()}", image, f"image/{fmt.lower()}")}
        while True:
            try:
                resp = await self.client.post("/v1/jobs", data=data, files=files)
                if resp.status_code == 202:
                    body = resp.json()
                    job = Job(body["id"], image, body["session_id"])
                    self.accepted.append(job)
                    return job
                assert resp.status_code in (429, 503), resp.text  # overload or Redis away: retry
            except httpx.HTTPError:
                pass
            self.refusals += 1
            await asyncio.sleep(RETRY_S)

    async def follow(self, job: Job, timeout_s: float = 300.0) -> None:
        """Read the job's events until its terminal one, disconnecting at random and resuming."""
        deadline = time.monotonic() + timeout_s
        while job.final is None and time.monotonic() < deadline:
            try:
                await self._read(job, drop_after=self.rng.choice([1, 2, 3, None]))
            except (httpx.HTTPError, json.JSONDecodeError):
                await asyncio.sleep(RETRY_S)  # the gateway lost Redis for a moment
            job.resumes += 1

    async def _read(self, job: Job, drop_after: int | None) -> None:
        headers = {"Last-Event-ID": job.last_id}
        async with self.client.stream("GET", f"/v1/jobs/{job.job_id}/events", headers=headers) as resp:
            if resp.status_code != 200:
                await asyncio.sleep(RETRY_S)
                return
            seen = 0
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line.removeprefix("data:").strip())
                job.last_id = event["id"]
                if event["type"] == "token":
                    job.tokens.append((event["index"], len(event["token_ids"]), event["text"]))
                    seen += 1
                elif event["type"] in ("done", "error") or event.get("status") in TERMINAL:
                    job.final = event
                    return
                if drop_after is not None and seen >= drop_after:
                    return  # the client goes away mid-stream and comes back
