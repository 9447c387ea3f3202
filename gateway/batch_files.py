"""OpenAI's ``/v1/files`` for batches: JSONL input files (checked line by line when uploaded) and the
output and error files a batch produces. A file is a record plus a list of its lines in Redis,
visible only to the tenant that owns it, kept ``VLMQ_BATCH_FILE_TTL_S``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from gateway.errors import APIError
from gateway.state import GatewayState
from shared.values import as_str

ENDPOINT = "/v1/chat/completions"  # the only batch endpoint


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def check_batch_lines(data: bytes) -> list[str]:
    """The JSONL lines of a batch input file, each a request OpenAI's batch format allows."""
    try:
        lines = [line for line in data.decode().splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise APIError(400, "file: not UTF-8 text (JSONL expected)", param="file") from None
    if not lines:
        raise APIError(400, "file: no requests in it", param="file")
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        seen.add(_check_line(line, number, seen))
    return lines


def _check_line(line: str, number: int, seen: set[str]) -> str:
    where = f"file: line {number}"
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):
        raise APIError(400, f"{where}: not JSON", param="file") from None
    if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
        raise APIError(400, f"{where}: expected an object with custom_id, method, url, body", param="file")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
        raise APIError(400, f"{where}: custom_id missing or repeated", param="file")
    if request.get("method", "POST") != "POST" or request.get("url") != ENDPOINT:
        raise APIError(400, f"{where}: only POST {ENDPOINT} is supported", param="file")
    return custom_id


async def store_file(
    state: GatewayState, tenant: str | None, purpose: str, filename: str, lines: list[str], size: int
) -> dict[str, Any]:
    created, ttl = time.time(), state.settings.batch_file_ttl_s
    file_id, now = new_file_id(), int(created)
    record = {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": now,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": now + ttl,
    }
    keys = state.keys
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.file(file_id), mapping={"record": json.dumps(record), "tenant": tenant or ""})
        pipe.expire(keys.file(file_id), ttl)
        if lines:
            pipe.rpush(keys.file_lines(file_id), *lines)
            pipe.expire(keys.file_lines(file_id), ttl)
        pipe.zadd(keys.tenant_files(tenant), {file_id: created})  # the list's order
        pipe.expire(keys.tenant_files(tenant), ttl)
        await pipe.execute()
    return record


async def load_file(state: GatewayState, file_id: str, tenant: str | None) -> dict[str, Any]:
    """The file's record, if ``tenant`` owns it (else 404, like a missing one)."""
    raw: Any = await state.redis.hgetall(state.keys.file(file_id))
    if not raw or as_str(raw.get(b"tenant", b"")) != (tenant or ""):
        raise APIError(404, f"file {file_id[:80]!r} not found", param="file_id", code="file_not_found")
    record: dict[str, Any] = json.loads(raw[b"record"])
    return record


async def file_content(state: GatewayState, file_id: str, tenant: str | None) -> bytes:
    await load_file(state, file_id, tenant)
    lines: Any = await state.redis.lrange(state.keys.file_lines(file_id), 0, -1)
    return b"".join(line + b"\n" for line in lines)


async def page_of(redis: Any, key: str, limit: int, after: str | None) -> tuple[list[str], bool]:
    """Up to ``limit`` members of a sorted set, newest first, after member ``after``; and whether
    more follow. An ``after`` not in the set (another tenant's, or expired) is a 400."""
    start = 0
    if after:
        rank = await redis.zrevrank(key, after)
        if rank is None:
            raise APIError(400, f"after: {after[:80]!r} is not in this list (expired?)", param="after")
        start = rank + 1
    ids: Any = await redis.zrevrange(key, start, start + limit)  # one more: does a next page exist
    return [as_str(i) for i in ids[:limit]], len(ids) > limit


async def list_files(
    state: GatewayState, tenant: str | None, purpose: str | None, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], bool]:
    """The tenant's files, newest first (of ``purpose`` only, if given); and whether more follow."""
    files: list[dict[str, Any]] = []
    key, more = state.keys.tenant_files(tenant), True
    while more and len(files) < limit:
        ids, more = await page_of(state.redis, key, limit, after)
        for file_id in ids:
            after = file_id
            try:
                record = await load_file(state, file_id, tenant)
            except APIError:  # expired meanwhile
                continue
            if purpose is None or record["purpose"] == purpose:
                files.append(record)
    return files[:limit], more or len(files) > limit


async def delete_file(state: GatewayState, file_id: str, tenant: str | None) -> None:
    """Delete a file the tenant owns; refused (409) while it is the input of an unfinished batch."""
    await load_file(state, file_id, tenant)
    if batch_id := await _batch_reading(state, file_id):
        raise APIError(
            409,
            f"file {file_id!r} is the input of batch {batch_id!r}, which has not finished; cancel it first",
            param="file_id",
            code="file_in_use",
        )
    # Its id stays in the tenant's list (which lists only ids with a record, and expires): a client
    # that deletes what it pages through still pages on from it (``after``).
    await state.redis.delete(state.keys.file(file_id), state.keys.file_lines(file_id))


async def _batch_reading(state: GatewayState, file_id: str) -> str | None:
    """The unfinished batch whose input is ``file_id``, if any."""
    active: Any = await state.redis.smembers(state.keys.active_batches())
    for batch_id in sorted(as_str(b) for b in active):
        raw: Any = await state.redis.hget(state.keys.batch(batch_id), "batch")
        if raw is not None and json.loads(raw).get("input_file_id") == file_id:
            return batch_id
    return None
