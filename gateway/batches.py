"""OpenAI's Batch API on vlmq's durable queue: a batch is a record in Redis; the gateway's batch
driver (``gateway.batch_driver``) turns its input lines into jobs at batch priority and collects
their results into an output and an error file. Everything is in Redis, so a batch survives the
death of any process, a gateway's included.

Statuses: in_progress -> finalizing -> completed; cancelling -> cancelled; expired (past its
``completion_window``: what did not finish goes to the error file). Input files are checked when
uploaded, so a batch never sits in ``validating``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from gateway.batch_files import ENDPOINT, load_file, page_of
from gateway.errors import APIError
from gateway.state import GatewayState
from shared.values import as_str

WINDOW = re.compile(r"^(\d{1,4})h$")  # OpenAI: "24h"; vlmq takes any whole number of hours
TERMINAL = {"completed", "failed", "expired", "cancelled"}
FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}", re.ASCII)  # ours are file-<hex>; others are no file


async def create_batch(state: GatewayState, tenant: str | None, body: dict[str, Any]) -> dict[str, Any]:
    endpoint, window = body.get("endpoint"), str(body.get("completion_window", "24h"))
    if endpoint != ENDPOINT:
        raise APIError(400, f"endpoint: only {ENDPOINT} is supported", param="endpoint")
    hours = WINDOW.match(window)
    if hours is None or int(hours.group(1)) == 0:
        raise APIError(
            400, "completion_window: a whole number of hours such as 24h", param="completion_window"
        )
    input_id = body.get("input_file_id")
    if not isinstance(input_id, str) or not FILE_ID.fullmatch(input_id):
        raise APIError(400, "input_file_id: a file id (file-...) is required", param="input_file_id")
    if (await load_file(state, input_id, tenant))["purpose"] != "batch":
        raise APIError(400, "input_file_id: not a file uploaded with purpose batch", param="input_file_id")
    total = int(await state.redis.llen(state.keys.file_lines(input_id)))
    created = time.time()  # the list's order: to the microsecond, batches made in one second too
    now = int(created)
    batch = {
        "id": f"batch_{uuid.uuid4().hex}",
        "object": "batch",
        "endpoint": ENDPOINT,
        "input_file_id": input_id,
        "completion_window": window,
        "status": "in_progress",
        "created_at": now,
        "in_progress_at": now,
        "expires_at": now + 3600 * int(hours.group(1)),
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else None,
    }
    await _save_new(state, tenant, batch, created)
    return batch


async def _save_new(state: GatewayState, tenant: str | None, batch: dict[str, Any], created: float) -> None:
    keys, ttl = state.keys, state.settings.batch_file_ttl_s
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(
            keys.batch(batch["id"]), mapping={"batch": json.dumps(batch), "tenant": tenant or "", "next": 0}
        )
        pipe.expire(keys.batch(batch["id"]), ttl)
        pipe.sadd(keys.active_batches(), batch["id"])
        pipe.zadd(keys.tenant_batches(tenant), {batch["id"]: created})
        pipe.expire(keys.tenant_batches(tenant), ttl)
        await pipe.execute()


async def load_batch(state: GatewayState, batch_id: str, tenant: str | None) -> dict[str, Any]:
    """The batch as OpenAI shows it, if ``tenant`` made it (else 404)."""
    raw: Any = await state.redis.hgetall(state.keys.batch(batch_id))
    if not raw or as_str(raw.get(b"tenant", b"")) != (tenant or ""):
        raise APIError(404, f"batch {batch_id[:80]!r} not found", param="batch_id", code="batch_not_found")
    batch: dict[str, Any] = json.loads(raw[b"batch"])
    cancel = raw.get(b"cancel")
    if cancel and batch["status"] not in TERMINAL:  # asked; the driver has not ended it yet
        batch.update(status="cancelling", cancelling_at=int(float(cancel)))
    return batch


async def list_batches(
    state: GatewayState, tenant: str | None, limit: int, after: str | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The tenant's batches, newest first, after the batch ``after`` (a page's last id); and
    whether more follow."""
    ids, more = await page_of(state.redis, state.keys.tenant_batches(tenant), limit, after)
    batches = []
    for batch_id in ids:
        try:
            batches.append(await load_batch(state, batch_id, tenant))
        except APIError:  # expired meanwhile
            continue
    return batches, more


async def cancel_batch(state: GatewayState, batch_id: str, tenant: str | None) -> dict[str, Any]:
    """Ask the driver to stop (a flag of its own: the driver owns the batch record): no more of its
    jobs start, running ones are cancelled."""
    batch = await load_batch(state, batch_id, tenant)
    if batch["status"] in TERMINAL:
        return batch
    await state.redis.hsetnx(state.keys.batch(batch_id), "cancel", time.time())
    return await load_batch(state, batch_id, tenant)
