"""Accepting a job (docs/service-contract.md §1): validate, build the JobSpec, admit, write,
enqueue the decode task, then record the session.

Every check that can refuse a request (validation, admission: 429 when the queues are full)
runs before the first write, so a refused request leaves nothing behind in Redis. Order of the
writes: image + job record (one MULTI) -> decode task + session (a second MULTI: the task is an
LPUSH onto the Celery queue, see ``gateway.decode_queue``). An enqueue failure (503) therefore
leaves the session untouched; the job stays, ``failed`` with ``error_code=queue_unavailable``
(a client polling it gets the reason), and the image bytes expire with their TTL.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.admission import admit
from gateway.errors import APIError
from gateway.images import ImageInfo, inspect_image_async
from gateway.jobs import count_outcome, finish_job
from gateway.params import JobParams, check_limits
from gateway.sessions import Session, load_session, new_session_fields
from gateway.state import GatewayState
from shared import result_cache, sessions
from shared.jobs import EVENTS_MAXLEN, new_job_hash
from shared.schemas import ChatTurn, ErrorCode, JobEvent, JobSpec, JobStatus, SamplingSpec, StageTimings

log = logging.getLogger(__name__)


@dataclass
class PreparedJob:
    """A validated job, nothing written yet."""

    spec: JobSpec
    image: ImageInfo | None = None  # new upload to store (None: session image or no image)
    image_bytes: bytes | None = None
    session_fields: dict[str, str] | None = None  # create (or restart) the session with these
    touch_session: bool = False  # refresh the TTL of an existing session


@dataclass
class Accepted:
    spec: JobSpec
    status: JobStatus
    cached: result_cache.CachedResult | None = None


def new_id() -> str:
    return uuid.uuid4().hex


def sampling_spec(params: JobParams, default_max_tokens: int) -> SamplingSpec:
    seed = params.seed
    if params.temperature > 0 and seed is None:
        # Assigned once at submission: a retried attempt regenerates the same tokens.
        seed = random.randrange(2**31)
    return SamplingSpec(
        max_tokens=params.max_tokens or default_max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=seed,
        stop=params.stop,
    )


async def prepare_job(
    state: GatewayState, params: JobParams, image_bytes: bytes | None, source: str = "jobs"
) -> PreparedJob:
    settings = state.settings
    check_limits(params, settings)
    info = None
    if image_bytes is not None:
        info = await inspect_image_async(image_bytes, settings.max_image_bytes, settings.max_image_pixels)
    session = await load_session(state.redis, state.keys, params.session_id) if params.session_id else None
    now = time.time()
    spec = JobSpec(
        job_id=new_id(),
        created_at=now,
        deadline=now + params.timeout_s if params.timeout_s else None,
        messages=[],
        sampling=sampling_spec(params, settings.default_max_tokens),
        session_id=params.session_id or new_id(),
        use_cache=params.use_cache,
        cancel_on_disconnect=params.cancel_on_disconnect,
        source=source,  # type: ignore[arg-type]
    )
    if info is None:
        return await _continue_session(state, spec, params, session)
    return _with_new_image(spec, params, session, info, image_bytes)


async def _continue_session(
    state: GatewayState, spec: JobSpec, params: JobParams, session: Session | None
) -> PreparedJob:
    """No upload: ask about the session's image, after the session's conversation."""
    if session is None or not session.image_digest:
        hint = "session not found or expired" if params.session_id else "no session_id given"
        raise APIError(
            400,
            f"image: required ({hint}); attach an image, or name a session that has one",
            param="image",
            code="image_required",
        )
    _check_system(params, session)
    if not await state.redis.exists(state.keys.image(session.image_digest)):
        raise APIError(
            400, "image: the session's image has expired; send it again", param="image", code="image_expired"
        )
    spec.image_digest, spec.image_format = session.image_digest, session.image_format
    spec.messages = [
        *session.messages,
        ChatTurn(role="user", text=params.prompt, image=_no_image_turn(session)),
    ]
    return PreparedJob(spec=spec, touch_session=True)


def _with_new_image(
    spec: JobSpec, params: JobParams, session: Session | None, info: ImageInfo, data: bytes | None
) -> PreparedJob:
    spec.image_digest, spec.image_format = info.digest, info.format
    if session is not None and session.image_digest == info.digest:
        # Same image again in its session: carry on with the conversation.
        _check_system(params, session)
        turn = ChatTurn(role="user", text=params.prompt, image=_no_image_turn(session))
        spec.messages = [*session.messages, turn]
        return PreparedJob(spec=spec, image=info, image_bytes=data, touch_session=True)
    # New session, or a new image in a session: the conversation starts over about it.
    system = [ChatTurn(role="system", text=params.system)] if params.system else []
    spec.messages = [*system, ChatTurn(role="user", text=params.prompt, image=True)]
    fields = new_session_fields(info.digest, info.format, params.system)
    return PreparedJob(spec=spec, image=info, image_bytes=data, session_fields=fields)


def _no_image_turn(session: Session) -> bool:
    """True when no earlier turn carries the image (its first user turn then does)."""
    return not any(t.image for t in session.messages)


def _check_system(params: JobParams, session: Session) -> None:
    if params.system is not None and params.system != session.system:
        raise APIError(
            400,
            "system: a session's system prompt is fixed when it starts; start a new session to change it",
            param="system",
        )


async def commit_job(state: GatewayState, job: PreparedJob, use_result_cache: bool = True) -> Accepted:
    """Cache hit: one MULTI, no work. Else admit (429), write image + job, then enqueue + session."""
    spec = job.spec
    cached = await _cached_result(state, spec) if use_result_cache else None
    if cached is not None:
        await _write(state, job, cached, session=True)
        await count_outcome(state, JobStatus.DONE)
        state.metrics.submitted.labels(spec.source).inc()
        return Accepted(spec, JobStatus.DONE, cached)
    await admit(state.redis, state.keys, state.settings.max_queue_depth, state.throughput)
    await _write(state, job, None, session=False)
    await _enqueue(state, job)
    state.metrics.submitted.labels(spec.source).inc()
    return Accepted(spec, JobStatus.QUEUED)


async def _write(
    state: GatewayState, job: PreparedJob, cached: result_cache.CachedResult | None, session: bool
) -> None:
    async with state.redis.pipeline(transaction=True) as pipe:
        _write_image(pipe, state, job)
        if session:
            _write_session(pipe, state, job)
        _write_job(pipe, state, job.spec, cached)
        await pipe.execute()


async def _enqueue(state: GatewayState, job: PreparedJob) -> None:
    """Decode task and session in one MULTI: a refused LPUSH aborts both (EXECABORT)."""
    spec = job.spec
    try:
        async with state.redis.pipeline(transaction=True) as pipe:
            state.decode.push(pipe, spec.job_id)
            _write_session(pipe, state, job)
            await pipe.execute()
    except Exception as exc:  # broker down: the job must not stay queued forever
        log.exception("decode enqueue failed for %s", spec.job_id)
        await fail_job(state, spec.job_id, f"could not enqueue the decode task: {exc}")
        raise APIError(
            503,
            "decode queue unavailable, retry shortly",
            code="queue_unavailable",
            headers={"Retry-After": "1"},
        ) from exc


def cache_headers(accepted: Accepted, bypassed: bool, max_age: int) -> dict[str, str]:
    """Response headers saying whether the answer came from the result cache (every route)."""
    if accepted.cached is not None:
        return {"Cache-Control": f"public, max-age={max_age}", "X-VLMQ-Result-Cache": "hit"}
    return {"Cache-Control": "no-store", "X-VLMQ-Result-Cache": "bypass" if bypassed else "miss"}


async def _cached_result(state: GatewayState, spec: JobSpec) -> result_cache.CachedResult | None:
    key = result_cache.cache_key(state.keys, state.settings.result_model_id, spec)
    if key is None:
        return None
    hit = result_cache.decode(await state.redis.get(key))
    state.metrics.result_cache.labels("hit" if hit else "miss").inc()
    return hit


def _write_image(pipe: aioredis.client.Pipeline, state: GatewayState, job: PreparedJob) -> None:
    digest = job.spec.image_digest
    if digest is None:
        return
    key, ttl = state.keys.image(digest), state.settings.image_ttl_s
    if job.image_bytes is not None:
        pipe.set(key, job.image_bytes, ex=ttl, nx=True)  # stored once per digest
    pipe.expire(key, ttl)  # every new job keeps its image alive


def _write_session(pipe: aioredis.client.Pipeline, state: GatewayState, job: PreparedJob) -> None:
    sid = job.spec.session_id
    if sid is None or job.spec.source == "openai":  # OpenAI requests carry their history themselves
        return
    key = state.keys.session(sid)
    if job.session_fields is not None:
        pipe.delete(key)
        fields: dict[Any, Any] = job.session_fields
        pipe.hset(key, mapping=fields)
    if job.session_fields is not None or job.touch_session:
        pipe.expire(key, state.settings.session_ttl_s)


def _write_job(
    pipe: aioredis.client.Pipeline,
    state: GatewayState,
    spec: JobSpec,
    cached: result_cache.CachedResult | None,
) -> None:
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
        sessions.record_turn(pipe, keys, spec, cached.text, state.settings.session_ttl_s)
    pipe.hset(keys.job(spec.job_id), mapping=fields)
    pipe.expire(keys.job(spec.job_id), ttl)
    for event in events:
        entry: dict[Any, Any] = dict(event.to_fields())
        pipe.xadd(keys.job_events(spec.job_id), entry, maxlen=EVENTS_MAXLEN, approximate=True)
    pipe.expire(keys.job_events(spec.job_id), ttl)


async def fail_job(state: GatewayState, job_id: str, error: str) -> bool:
    return await finish_job(state, job_id, JobStatus.FAILED, ErrorCode.QUEUE_UNAVAILABLE, error)
