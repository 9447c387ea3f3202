"""The batch driver: every second, one gateway (a Redis lock, renewed as it works) moves every active
batch on. For each: collect the results of its finished jobs into its output and error lines,
start its next input lines as jobs (batch priority, its tenant's quotas, ``VLMQ_BATCH_INFLIGHT``
at a time; a 429 just waits for the next second), and end it when every line has an answer, when
it is cancelled, or when its ``completion_window`` is over. All its state is in Redis, so any
gateway carries on where another stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError

from gateway.accept import submit
from gateway.batch_files import store_file
from gateway.errors import APIError, validation_message
from gateway.intake import from_openai
from gateway.job_records import ANY_TENANT, cancel_job
from gateway.keyring import Tenant
from gateway.openai_schema import ChatCompletionRequest, completion_json_of, terminal_error
from gateway.state import GatewayState
from shared.jobs import JobRecord
from shared.schemas import ErrorCode, JobStatus
from shared.values import as_str

log = logging.getLogger(__name__)
TICK_S = 1.0
LOCK_MS = 10_000
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


PLACEHOLDER = "-"


class LostLock(Exception):
    pass


@dataclass
class Batch:
    """One active batch as the driver works on it (``record``: what clients see)."""

    id: str
    record: dict[str, Any]
    tenant: str | None
    next_line: int  # the first input line not started yet
    stopping: str | None  # "cancelled" or "expired" once it must stop starting jobs

    @property
    def input(self) -> str:
        return str(self.record["input_file_id"])

    @property
    def total(self) -> int:
        return int(self.record["request_counts"]["total"])


class BatchDriver:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.redis: Any = state.redis  # redis-py's return types are unions; the shapes are known here
        self.keys = state.keys
        self.me = uuid.uuid4().hex

    async def run(self) -> None:
        """Until cancelled (the gateway's lifespan ends)."""
        while True:
            try:
                if await self._hold_lock():
                    await self.tick()
            except LostLock:  # another gateway drives now
                pass
            except Exception:  # Redis away, a bug: log, try again next second
                log.exception("batch driver tick failed")
            await asyncio.sleep(TICK_S)

    async def _active_batches(self) -> list[bytes]:
        """The active batch ids. The set keeps a placeholder member so that it always exists: an
        idle tick then never reads a missing key (keyspace misses stay a sign of a bad lookup)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(self.keys.active_batches(), PLACEHOLDER)
        pipe.smembers(self.keys.active_batches())
        members = (await pipe.execute())[1]
        return [m for m in members if m != PLACEHOLDER.encode()]

    async def _hold_lock(self) -> bool:
        lock = self.keys.batch_driver_lock()
        if await self.redis.set(lock, self.me, nx=True, px=LOCK_MS):
            return True
        return bool(await self.redis.eval(RENEW_LUA, 1, lock, self.me, LOCK_MS))

    async def tick(self) -> None:
        for batch_id in await self._active_batches():
            if not await self._hold_lock():
                raise LostLock
            batch = await self._load(as_str(batch_id))
            if batch is not None:
                await self.drive(batch)

    async def _load(self, batch_id: str) -> Batch | None:
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        if not raw:
            await self.redis.srem(self.keys.active_batches(), batch_id)
            return None
        record = json.loads(raw[b"batch"])
        stopping = (
            "cancelled" if raw.get(b"cancel") else "expired" if time.time() > record["expires_at"] else None
        )
        tenant = as_str(raw.get(b"tenant", b"")) or None
        return Batch(batch_id, record, tenant, int(raw.get(b"next", 0)), stopping)

    async def drive(self, batch: Batch) -> None:
        await self.collect(batch)
        if batch.stopping is None:
            await self.start_more(batch)
        else:
            await self.cancel_running(batch)
        await self.update(batch)

    # --- results ---
    async def collect(self, batch: Batch) -> None:
        running = await self.redis.hgetall(self.keys.batch_inflight(batch.id))
        for line_no, job_id in running.items():
            raw = await self.redis.hgetall(self.keys.job(as_str(job_id)))
            try:
                result = await self._collected(batch, int(line_no), as_str(job_id), raw)
            except redis.RedisError:
                raise
            except Exception:  # a record this release cannot read: that line fails, not the batch
                log.exception("batch %s: line %s could not be collected", batch.id, as_str(line_no))
                result = _internal_error_line(
                    await self._custom_id_if_any(batch, int(line_no)), as_str(job_id)
                )
            if result is not None:
                await self._record_result(batch, as_str(line_no), result)

    async def _collected(
        self, batch: Batch, line_no: int, job_id: str, raw: dict[bytes, bytes]
    ) -> tuple[str, str] | None:
        """The line's result, or None while its job runs."""
        record = JobRecord.from_hash(raw) if raw else None
        if record is not None and not record.status.terminal:
            return None
        custom_id = await self._custom_id(batch, line_no)
        return _result_line(custom_id, job_id, record, self.state.settings.model_name)

    async def _line(self, batch: Batch, line_no: int) -> dict[str, Any]:
        line = await self.redis.lindex(self.keys.file_lines(batch.input), line_no)
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    async def _custom_id(self, batch: Batch, line_no: int) -> str:
        return str((await self._line(batch, line_no))["custom_id"])

    async def _custom_id_if_any(self, batch: Batch, line_no: int) -> str | None:
        """The line's custom_id for an error line, or None where the line itself cannot be read."""
        try:
            return await self._custom_id(batch, line_no)
        except redis.RedisError:
            raise
        except Exception:  # the input file gone (deleted or expired): the error line says the rest
            return None

    async def _record_result(self, batch: Batch, line_no: str, result: tuple[str, str]) -> None:
        kind, text = result
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(self.keys.batch_results(batch.id, kind), text)
            pipe.hdel(self.keys.batch_inflight(batch.id), line_no)
            await pipe.execute()

    # --- new jobs ---
    async def start_more(self, batch: Batch) -> None:
        running = int(await self.redis.hlen(self.keys.batch_inflight(batch.id)))
        while batch.next_line < batch.total and running < self.state.settings.batch_inflight:
            if not await self.start_line(batch, batch.next_line):
                return  # queue full or over a quota: the next tick tries again
            batch.next_line, running = batch.next_line + 1, running + 1
            await self.redis.hset(self.keys.batch(batch.id), "next", batch.next_line)

    async def start_line(self, batch: Batch, line_no: int) -> bool:
        try:
            request = await self._line(batch, line_no)
        except redis.RedisError:
            raise
        except Exception:  # the input file gone (expired): this line fails, the batch goes on
            log.exception("batch %s: line %d could not be read", batch.id, line_no)
            await self._record_result(batch, str(line_no), _internal_error_line(None))
            return True
        try:
            job_id = await self._submit(request["body"], batch.tenant)
        except APIError as exc:
            if exc.status_code in (429, 503):
                return False
            error = _error_line(request["custom_id"], exc.status_code, exc.message, exc.code)
            await self._record_result(batch, str(line_no), error)
            return True
        except redis.RedisError:  # Redis away, not this line: the next tick starts it again
            raise
        except Exception:  # a bug this line's request runs into: it fails alone, the batch goes on
            log.exception("batch %s: line %d could not be started", batch.id, line_no)
            await self._record_result(batch, str(line_no), _internal_error_line(request.get("custom_id")))
            return True
        await self.redis.hset(self.keys.batch_inflight(batch.id), str(line_no), job_id)
        return True

    async def _submit(self, body: dict[str, Any], tenant: str | None) -> str:
        try:
            request = ChatCompletionRequest.model_validate({**body, "stream": False, "priority": "batch"})
        except ValidationError as exc:
            message, param = validation_message(list(exc.errors()))
            raise APIError(400, message, param=param) from None
        sub = await from_openai(request, self.state.settings, None, no_cache=False)
        accepted = await submit(self.state, sub.by(self._tenant(tenant)), route="batch")
        return accepted.spec.job_id

    def _tenant(self, name: str | None) -> Tenant | None:
        """The tenant as its key defines it now (its quotas), or a plain one if its key is gone."""
        if name is None:
            return None
        return self.state.keyring.by_name(name) or Tenant(name, priority="batch")

    # --- counts and the end ---
    async def cancel_running(self, batch: Batch) -> None:
        running = await self.redis.hgetall(self.keys.batch_inflight(batch.id))
        for job_id in running.values():
            with contextlib.suppress(APIError):  # already finished, or gone
                await cancel_job(self.state, as_str(job_id), ANY_TENANT)

    async def update(self, batch: Batch) -> None:
        """Counts now; the output and error files once every started job has an answer."""
        running = int(await self.redis.hlen(self.keys.batch_inflight(batch.id)))
        out = [as_str(x) for x in await self.redis.lrange(self.keys.batch_results(batch.id, "out"), 0, -1)]
        err = [as_str(x) for x in await self.redis.lrange(self.keys.batch_results(batch.id, "err"), 0, -1)]
        batch.record["request_counts"].update(completed=len(out), failed=len(err))
        if running == 0 and (batch.stopping is not None or batch.next_line >= batch.total):
            await self._finalize(batch, out, [*err, *await self._unstarted(batch)])
        else:
            await self.redis.hset(self.keys.batch(batch.id), "batch", json.dumps(batch.record))

    async def _unstarted(self, batch: Batch) -> list[str]:
        """Error lines for the input lines a cancelled or expired batch never started."""
        if batch.stopping is None:
            return []
        lines = await self.redis.lrange(self.keys.file_lines(batch.input), batch.next_line, -1)
        code, message = f"batch_{batch.stopping}", f"not started: the batch was {batch.stopping}"
        return [_error_line(json.loads(line)["custom_id"], None, message, code)[1] for line in lines]

    async def _finalize(self, batch: Batch, out: list[str], err: list[str]) -> None:
        now, status, record = int(time.time()), batch.stopping or "completed", batch.record
        record.update(status=status, finalizing_at=now, output_file_id=await self._file(batch, "output", out))
        record[f"{status}_at"] = now
        record["request_counts"].update(completed=len(out), failed=len(err))
        if err:
            record["error_file_id"] = await self._file(batch, "error", err)
        keys = self.keys
        done = [
            keys.batch_inflight(batch.id),
            keys.batch_results(batch.id, "out"),
            keys.batch_results(batch.id, "err"),
        ]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.batch(batch.id), "batch", json.dumps(record))
            pipe.srem(keys.active_batches(), batch.id)
            pipe.delete(*done)
            await pipe.execute()
        log.info("batch %s %s: %d answered, %d failed", batch.id, status, len(out), len(err))

    async def _file(self, batch: Batch, kind: str, lines: list[str]) -> str:
        size = sum(len(line.encode()) + 1 for line in lines)
        stored = await store_file(
            self.state, batch.tenant, "batch_output", f"{batch.id}_{kind}.jsonl", lines, size
        )
        return str(stored["id"])


def _result_line(custom_id: str, job_id: str, record: JobRecord | None, model: str) -> tuple[str, str]:
    """("out", line) for a job done, else ("err", line), in OpenAI's batch output format."""
    if record is None:
        message = "the job's record expired before it was collected"
        return _error_line(custom_id, None, message, ErrorCode.INTERNAL)
    if record.status is not JobStatus.DONE:
        status, message, code = terminal_error(record.status, record.error_code, record.error)
        return _error_line(custom_id, status, message, code, job_id)
    response = {"status_code": 200, "request_id": job_id, "body": completion_json_of(job_id, model, record)}
    line = {"id": f"batch_req_{job_id}", "custom_id": custom_id, "response": response, "error": None}
    return "out", json.dumps(line)


def _internal_error_line(custom_id: str | None, job_id: str | None = None) -> tuple[str, str]:
    message = "internal error: the request could not be run (the gateway's log says why)"
    return _error_line(custom_id, 500, message, ErrorCode.INTERNAL, job_id)


def _error_line(
    custom_id: str | None, status: int | None, message: str, code: str | None, job_id: str | None = None
) -> tuple[str, str]:
    error = {"code": code, "message": message}
    response = {"status_code": status, "request_id": job_id, "body": {"error": error}} if status else None
    line_id = f"batch_req_{job_id or uuid.uuid4().hex}"
    line = {"id": line_id, "custom_id": custom_id, "response": response, "error": error}
    return "err", json.dumps(line)
