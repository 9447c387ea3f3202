"""Accepting a job (docs/service-contract.md §1): result cache, admission, writes, decode task.

Every check that can refuse a request (intake validation, admission: 429 when the queues are full)
runs before the first write, so a refused request leaves nothing behind in Redis. The writes are one
MULTI: image + job record + decode task + conversation (the task is an LPUSH onto the Celery queue,
see ``shared.decode_task``; a text-only job, or a turn whose images the worker that holds them can
serve, is handed to inference instead, ``gateway.handoff``). A MULTI refused when its commands were
queued (EXECABORT: e.g. the broker refusing the LPUSH, Redis out of memory) wrote nothing: the image
and the job record are then written alone and the job failed, so the conversation is untouched, the
job stays ``failed`` with ``error_code=queue_unavailable`` (a client polling it gets the reason) and
the image bytes expire with their TTL. Any other failure of that MULTI (a lost reply, an error when
it ran) may have applied some or all of it: the job is failed the same way (whatever stage has it
then stops at its terminal state), and the conversation may hold the turn. Both answer 503
``queue_unavailable``.

The lookup, admission and the routing read of a job handed straight to inference (its owner) share a
round trip, so a result-cache hit holds an admission place (and, interactive, the batch hold) for
that round trip; its own MULTI gives the place back (should that MULTI fail, the sweeper drops the
place, the hold expires).

``VLMQ_REDIS_MIN_REPLICAS`` > 0: the writes are two MULTIs, image + job record, then decode task
+ conversation, each followed by a WAIT on its connection (``ReplicatedPipeline``), so no task is
enqueued for a record no replica holds and a 202 is only sent for writes a replica holds. Too few
replicas within ``VLMQ_REDIS_WAIT_MS``: 503, and the job is failed ``queue_unavailable`` like an
enqueue failure (its writes already ran on the master; FINISH_LUA is the one write every stage
respects, where a DEL would race a decode worker that already has the task). A result-cache hit
does not wait: its answer is in the response itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis

from gateway.admission import queue_admission, refuse_when_full
from gateway.errors import APIError
from gateway.handoff import (
    NextStage,
    Route,
    next_stage,
    plan_route,
    queue_handoff,
    queue_route_read,
    read_next_stage,
)
from gateway.intake import Submission
from gateway.job_records import count_outcome, finish_job
from gateway.job_spec import PreparedJob, build_job
from gateway.quotas import charge
from gateway.state import GatewayState
from shared import conversations, log_context, result_cache, tracing
from shared.jobs import EVENTS_MAXLEN, new_job_hash
from shared.redis_clients import NotReplicated, ReplicatedPipeline
from shared.schemas import ErrorCode, JobEvent, JobSpec, JobStatus, StageTimings
from shared.values import as_str

log = logging.getLogger(__name__)


@dataclass
class Accepted:
    spec: JobSpec
    status: JobStatus
    cached: result_cache.CachedResult | None = None
    headers: dict[str, str] = field(default_factory=dict)  # the tenant's rate-limit headers
    queued_event_id: str = "0"  # the job's first event (status queued): a fresh reader starts after it


async def submit(state: GatewayState, sub: Submission, route: str | None = None) -> Accepted:
    """Build the job from a submission, charge its tenant's quotas, accept it (or refuse it,
    leaving nothing behind but the quota counts). ``route`` labels the metrics (default: the
    submission's source)."""
    route = route or sub.source
    with state.metrics.submit_seconds.labels(route).time(), tracing.span("vlmq.submit", route=route) as span:
        job = await build_job(state, sub)
        spec = job.spec
        log_context.bind(spec.job_id)  # this request's later log lines name the job
        span.set_attribute("vlmq.job_id", spec.job_id)
        headers = await charge(state.redis, state.keys, sub.tenant, spec.job_id, spec.sampling.max_tokens)
        accepted = await accept_job(state, job, sub.use_result_cache)
    state.metrics.submitted.labels(route).inc()
    accepted.headers = headers
    return accepted


async def accept_job(state: GatewayState, job: PreparedJob, use_result_cache: bool = True) -> Accepted:
    """Result-cache lookup and admission in one round trip. A hit: one MULTI (which also gives
    back the place admission reserved), no work. Else 429 when full, or the writes and the task."""
    spec = job.spec
    route = plan_route(state, spec)
    cached, admitted, owner = await _lookup_and_admit(state, spec, use_result_cache, route)
    if cached is not None:  # served whether or not the queues had room
        queued_id = await _write(state, job, cached, conversation=True)
        await count_outcome(state, JobStatus.DONE)
        return Accepted(spec, JobStatus.DONE, cached, queued_event_id=queued_id)
    depth = state.settings.max_queue_depth
    await refuse_when_full(state.redis, state.keys, admitted, depth, state.throughput)
    if state.settings.redis_min_replicas > 0:
        try:
            queued_id = await _write(state, job, None, conversation=False)
        except NotReplicated as exc:
            raise await _not_replicated(state, spec.job_id, exc) from exc
        status = await _enqueue(state, job)
    else:
        queued_id, status = await _write_and_enqueue(state, job, next_stage(state, spec, route, owner))
    return Accepted(spec, status, queued_event_id=queued_id)


async def _write_and_enqueue(
    state: GatewayState, job: PreparedJob, stage: NextStage
) -> tuple[str, JobStatus]:
    """Image, job, decode task (or hand-over to ``stage``'s stream) and conversation in one MULTI:
    one round trip less than writing and enqueueing apart. Returns the queued event's id and the
    job's status."""
    spec = job.spec
    try:
        async with state.redis.pipeline(transaction=True) as pipe:
            _write_image(pipe, state, job)
            queued_at = _write_job(pipe, state, spec, None)
            handoff_at = len(pipe.command_stack)
            _queue_next_stage(pipe, state, spec, stage)
            _write_conversation(pipe, state, job)
            replies = await pipe.execute()
    except Exception as exc:  # nothing was written (EXECABORT) or Redis is going: fail the job
        log.exception("enqueue failed for %s", spec.job_id)
        await _record_refused(state, job, f"could not enqueue the job: {exc}")
        raise _queue_unavailable() from exc
    handed_over = stage.stream is not None and replies[handoff_at] == 1
    return as_str(replies[queued_at]), JobStatus.WAITING if handed_over else JobStatus.QUEUED


async def _record_refused(state: GatewayState, job: PreparedJob, error: str) -> None:
    """The job's record (and image), failed: what a client holding its id finds. The conversation
    is not written here (a lost reply to the MULTI may still have written it: module docstring)."""
    try:
        await _write(state, job, None, conversation=False)
        await fail_job(state, job.spec.job_id, error)
    except redis.RedisError:  # the answer is a 503 either way; the sweeper drops its admission
        log.warning("job %s: could not record the failure", job.spec.job_id, exc_info=True)
    except Exception:  # the job cannot be written at all: at least give its queue place back
        log.exception("job %s: could not record the failure", job.spec.job_id)
        await _release_admission(state, job.spec)


async def _release_admission(state: GatewayState, spec: JobSpec) -> None:
    """Free the place ``ADMIT_LUA`` reserved for a job that will never be written (best effort)."""
    keys, job_key = state.keys, state.keys.job(spec.job_id)
    try:
        async with state.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(keys.active_jobs(), job_key)
            pipe.zrem(keys.interactive_jobs(), job_key)
            await pipe.execute()
    except redis.RedisError:
        log.warning("job %s: could not release its queue place", spec.job_id, exc_info=True)


def _queue_next_stage(
    pipe: aioredis.client.Pipeline, state: GatewayState, spec: JobSpec, stage: NextStage
) -> None:
    """The decode task, or (text only, or a turn its worker holds the images of) the hand-over."""
    if stage.stream is None:
        state.decode.push(pipe, spec.job_id, spec.priority)
    else:
        queue_handoff(pipe, state, spec, stage)


def _queue_unavailable() -> APIError:
    return APIError(
        503, "decode queue unavailable, retry shortly", code="queue_unavailable", headers={"Retry-After": "1"}
    )


async def _write(
    state: GatewayState, job: PreparedJob, cached: result_cache.CachedResult | None, conversation: bool
) -> str:
    """Image, conversation and job in one MULTI; returns the id of the job's queued event."""
    async with _pipeline(state, replicated=cached is None) as pipe:
        _write_image(pipe, state, job)
        if conversation:
            _write_conversation(pipe, state, job)
        queued_at = _write_job(pipe, state, job.spec, cached)
        replies = await pipe.execute()
    return as_str(replies[queued_at])


async def _enqueue(state: GatewayState, job: PreparedJob) -> JobStatus:
    """With replicas to wait for, after the record's MULTI: decode task (or, text only, the
    hand-over to inference) and conversation in one MULTI: a refused LPUSH aborts both (EXECABORT).
    Returns the job's status after it."""
    spec = job.spec
    try:
        stage = await read_next_stage(state, spec)  # the owner now, after the first WAIT
        async with _pipeline(state, replicated=True) as pipe:
            _queue_next_stage(pipe, state, spec, stage)
            _write_conversation(pipe, state, job)
            replies = await pipe.execute()
    except NotReplicated as exc:
        raise await _not_replicated(state, spec.job_id, exc) from exc
    except Exception as exc:  # broker down: the job must not stay queued forever
        log.exception("enqueue failed for %s", spec.job_id)
        await fail_job(state, spec.job_id, f"could not enqueue the job: {exc}")
        raise _queue_unavailable() from exc
    handed_over = stage.stream is not None and replies[0] == 1  # 0: cancelled meanwhile
    return JobStatus.WAITING if handed_over else JobStatus.QUEUED


def _pipeline(state: GatewayState, replicated: bool) -> aioredis.client.Pipeline:
    """A MULTI pipeline; one that WAITs for ``redis_min_replicas`` after EXEC when asked and set."""
    replicas = state.settings.redis_min_replicas
    if replicated and replicas > 0:
        return ReplicatedPipeline(state.redis, replicas, state.settings.redis_wait_ms)
    return state.redis.pipeline(transaction=True)


async def _not_replicated(state: GatewayState, job_id: str, exc: NotReplicated) -> APIError:
    """Fail the job that no replica holds (it is not accepted) and say so: 503, retry."""
    log.warning("job %s not accepted: %s", job_id, exc)
    try:
        await fail_job(state, job_id, f"not replicated: {exc}")
    except redis.RedisError:  # the master itself is going: the answer is still 503
        log.warning("job %s: could not record the failure", job_id, exc_info=True)
    return APIError(
        503,
        f"job not accepted: {exc} (VLMQ_REDIS_MIN_REPLICAS); retry shortly",
        code="queue_unavailable",
        headers={"Retry-After": "1"},
    )


def cache_headers(accepted: Accepted, bypassed: bool, max_age: int) -> dict[str, str]:
    """Response headers: the result cache's say, and the tenant's rate limits (every route)."""
    if accepted.cached is not None:
        scope = "private" if accepted.spec.tenant else "public"  # a tenant's answer is its own
        return {
            "Cache-Control": f"{scope}, max-age={max_age}",
            "X-VLMQ-Result-Cache": "hit",
            **accepted.headers,
        }
    result = "bypass" if bypassed else "miss"
    return {"Cache-Control": "no-store", "X-VLMQ-Result-Cache": result, **accepted.headers}


async def _lookup_and_admit(
    state: GatewayState, spec: JobSpec, use_result_cache: bool, route: Route
) -> tuple[result_cache.CachedResult | None, Any, Any]:
    """The result cache's answer (None: no lookup or a miss), ``ADMIT_LUA``'s reply and the
    route's read (the owner a hand-over goes to; None when it needs no read), in one round trip."""
    settings = state.settings
    key = None
    if use_result_cache:
        key = result_cache.cache_key(state.keys, settings.result_model_id, spec, settings.result_cache_shared)
    hold_s = settings.batch_hold_s if spec.priority == "interactive" else 0.0
    async with state.redis.pipeline(transaction=False) as pipe:
        if key is not None:
            pipe.get(key)
        queue_admission(pipe, state.keys, spec.job_id, settings.max_queue_depth, hold_s)
        reads_route = queue_route_read(pipe, state, spec, route)
        replies = await pipe.execute()
    owner = replies[-1] if reads_route else None
    if key is None:
        return None, replies[0], owner
    hit = result_cache.decode(replies[0])
    state.metrics.result_cache_lookups.inc()
    if hit is not None:
        state.metrics.result_cache_hits.inc()
    return hit, replies[1], owner


def _write_image(pipe: aioredis.client.Pipeline, state: GatewayState, job: PreparedJob) -> None:
    ttl = state.settings.image_ttl_s
    for image in job.images:
        pipe.set(state.keys.image(image.info.digest), image.data, ex=ttl, nx=True)  # once per digest
    for digest in job.spec.image_digests():
        pipe.expire(state.keys.image(digest), ttl)  # every new job keeps its images alive


def _write_conversation(pipe: aioredis.client.Pipeline, state: GatewayState, job: PreparedJob) -> None:
    conversation_id = job.spec.conversation_id
    if conversation_id is None:
        return
    key = state.keys.conversation(conversation_id, job.spec.tenant)
    if job.conversation_fields is not None:
        pipe.delete(key)
        fields: dict[Any, Any] = job.conversation_fields
        pipe.hset(key, mapping=fields)
    if job.conversation_updates is not None:
        updates: dict[Any, Any] = job.conversation_updates
        pipe.hset(key, mapping=updates)
    if job.conversation_fields is not None or job.touch_conversation:
        pipe.expire(key, state.settings.session_ttl_s)


def _write_job(
    pipe: aioredis.client.Pipeline,
    state: GatewayState,
    spec: JobSpec,
    cached: result_cache.CachedResult | None,
) -> int:
    """Queue the job's hash and first events on ``pipe``; returns where the queued event's XADD is."""
    keys, ttl = state.keys, state.settings.job_ttl_s
    fields: dict[Any, Any] = dict(new_job_hash(spec))
    events = [JobEvent(type="status", status=JobStatus.QUEUED)]
    if cached is not None:
        done = JobEvent(
            type="done",
            final_text=cached.text,
            usage=cached.usage,
            finish_reason=cached.finish_reason,
            timings=StageTimings(),
        )
        events.append(done)
        fields.update(
            {
                "status": JobStatus.DONE.value,
                "text": cached.text,
                "usage": cached.usage.model_dump_json(),
                "finish_reason": cached.finish_reason,
                "timings": StageTimings().model_dump_json(),
                "result_cached": "1",
            }
        )
        conversations.record_turn(pipe, keys, spec, cached.text, state.settings.session_ttl_s)
        pipe.zrem(keys.active_jobs(), keys.job(spec.job_id))  # admission's place, if it gave one
        pipe.zrem(keys.interactive_jobs(), keys.job(spec.job_id))
    pipe.hset(keys.job(spec.job_id), mapping=fields)
    pipe.expire(keys.job(spec.job_id), ttl)
    queued_at = len(pipe.command_stack)
    for event in events:
        entry: dict[Any, Any] = dict(event.to_fields())
        pipe.xadd(keys.job_events(spec.job_id), entry, maxlen=EVENTS_MAXLEN, approximate=True)
    pipe.expire(keys.job_events(spec.job_id), ttl)
    return queued_at


async def fail_job(state: GatewayState, job_id: str, error: str) -> bool:
    return await finish_job(state, job_id, JobStatus.FAILED, ErrorCode.QUEUE_UNAVAILABLE, error)
