"""The ``vlmq.decode`` task: a thin Celery shell around ``worker.pipeline.DecodePipeline``.

Imported by worker processes only. The image processor is loaded once per process (in the
pool child, after fork, so no torch thread pool crosses a fork).
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import lru_cache
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import celeryd_after_setup, worker_process_init, worker_ready

from services.vlm.image_processor import ImageProcessorHandle
from shared import log_context, tracing
from shared.config import get_decode_worker_settings
from shared.decode_task import DECODE_TASK, QUEUES
from shared.heap import freeze_startup_heap
from shared.redis_clients import sync_client
from shared.schemas import ErrorCode
from worker import decode_spans, stop_signal
from worker.celery_app import app
from worker.claims import Claim, DecodeClaims
from worker.imaging import configure_pillow
from worker.pipeline import DecodeOutcome, DecodePipeline

log = logging.getLogger(__name__)
REDIS_RETRIES = 5
CLAIM_BUDGET_S = 5.0  # a task stops claiming after this long (soft time limit: 90 s)
MIN_WAIT_S = 0.01


@lru_cache(maxsize=1)
def pipeline() -> DecodePipeline:
    settings = get_decode_worker_settings()
    configure_pillow(settings.max_image_pixels)
    try:
        import torch

        torch.set_num_threads(1)  # one decode per process; parallelism comes from -c N
    except ImportError:
        pass
    client = sync_client(settings.redis_url, sentinel=settings.sentinel)
    return DecodePipeline(client, settings, ImageProcessorHandle.load(settings.model))


@worker_process_init.connect
def _warm_up(**_: object) -> None:
    tracing.setup("decode", get_decode_worker_settings().otlp_endpoint)  # per pool process: after fork
    handle = pipeline().processor
    freeze_startup_heap("decode process", get_decode_worker_settings().gc_freeze)
    log.info("decode process ready (image processor %s)", handle.processor_id)  # tests wait for this


@worker_process_init.connect
def _sigterm_ends_waits(**_: object) -> None:
    stop_signal.mark_pool_child()  # prefork children only: worker_process_init is not sent elsewhere


@worker_ready.connect
def _warm_up_threads(**_: object) -> None:
    """The threads pool forks no children (no ``worker_process_init``): its one process warms up here."""
    if get_decode_worker_settings().decode_pool == "threads":
        _warm_up()


@celeryd_after_setup.connect
def _freeze_before_fork(**_: object) -> None:
    """The main process's heap, frozen before a prefork pool forks (logging is set up by then): a
    child's own collections (the one before its freeze too) then never walk, and so never copy, the
    pages it shares with its parent (~100 MB of private memory a child, bench/README.md). The threads
    pool's one process freezes again once warmed up (``_warm_up``)."""
    freeze_startup_heap("decode main process", get_decode_worker_settings().gc_freeze)


class ClaimInterrupted(Exception):
    """A claimed job met a Redis error: it goes back to the queue unfinished (the claiming task's
    retries are not the job's own)."""


@lru_cache(maxsize=1)
def claims() -> DecodeClaims:
    settings = get_decode_worker_settings()
    ttl_s = int(app.conf.task_time_limit or 120) + 60  # outlives the task; the sweeper covers the rest
    if settings.decode_ack_emulation:  # a lost node's task then comes back after the visibility timeout
        ttl_s += settings.visibility_timeout_s
    served = list(app.amqp.queues.consume_from or ())  # the worker's -Q, selected before the fork
    return DecodeClaims(pipeline().r, pipeline().keys, DECODE_TASK, ttl_s, QUEUES, served)


@app.task(name=DECODE_TASK, bind=True, max_retries=REDIS_RETRIES)
def decode(self, job_id: str) -> str:
    """Decode the job's image into the model's pixel tensor and hand the job to inference; then
    the queue's waiting jobs, and those that come while the task waits (``worker.claims``)."""
    started = time.time()
    outcome = _decode_job(self, job_id)
    _decode_claimed(self, started, outcome.claims_due)
    return outcome.status


def _decode_job(
    task: Any, job_id: str, claimed: bool = False, read: list[Any] | None = None
) -> DecodeOutcome:
    started = time.time()
    with log_context.job(job_id):
        outcome = _decode(task, job_id, claimed, read)
    decode_spans.record(pipeline().r, pipeline().keys, job_id, started, outcome.status, outcome.detail)
    return outcome


def _decode_claimed(task: Any, task_started: float, claims_due: bool) -> None:
    """Up to ``VLMQ_DECODE_CLAIM_MAX`` more jobs of the task's own queue, one claim at a time, while
    the task is younger than ``CLAIM_BUDGET_S``: those waiting now and, for an interactive task, those
    that arrive within ``VLMQ_DECODE_LINGER_S`` of its last job. Past the budget (a long own job), a
    kept claim only goes back. A Redis error ends the claims (a claim the error left kept expires,
    and the sweeper re-enqueues its job)."""
    settings = get_decode_worker_settings()
    queue = (task.request.delivery_info or {}).get("routing_key")
    if settings.decode_claim_max == 0 or queue not in QUEUES:
        return
    linger = settings.decode_linger_s if queue == QUEUES[0] else 0.0  # batch work waits its turn
    if not (claims_due or linger > 0):
        return
    task_id = task.request.id
    try:
        if time.time() - task_started > CLAIM_BUDGET_S:
            claims().give_back(task_id, queue)
            return
        _claim_loop(task, queue, linger, task_started, settings.decode_claim_max)
    except ClaimInterrupted as exc:
        log.warning("task %s: a claimed job met a Redis error (%s): it goes back to the queue", task_id, exc)
        with contextlib.suppress(redis.RedisError):
            claims().give_back(task_id, queue)
    except stop_signal.WaitStopped:  # SIGTERM: what the wait may have moved goes back; the task ends
        log.info("task %s: stopped waiting for jobs (SIGTERM)", task_id)
        with contextlib.suppress(redis.RedisError):
            claims().give_back(task_id, queue)
    except (redis.RedisError, SoftTimeLimitExceeded) as exc:
        log.warning("task %s: claims stopped (%s); a kept claim returns through the sweeper", task_id, exc)


def _claim_loop(task: Any, queue: str, linger: float, task_started: float, limit: int) -> None:
    task_id, arm = task.request.id, linger > 0
    claim, taken = claims().first(task_id, queue, arm), 0
    while True:
        if claim.outcome == "armed":
            claim = _wait_for_job(task_id, queue, linger, task_started)
        if claim.outcome != "claimed":
            return
        taken += 1
        if claim.job_id is not None:
            _decode_job(task, claim.job_id, claimed=True, read=claim.read)
        if taken == limit or time.time() - task_started > CLAIM_BUDGET_S or stop_signal.stopping():
            claims().release(task_id, queue, claim)
            return
        claim = claims().next(task_id, queue, claim, arm)  # ends this claim (its job is done)


def _wait_for_job(task_id: str, queue: str, linger: float, task_started: float) -> Claim:
    """The queue's next job, waited for up to ``linger`` seconds and never past the claim budget."""
    timeout = min(linger, CLAIM_BUDGET_S - (time.time() - task_started))
    if timeout < MIN_WAIT_S:  # too little left to wait for (BLMOVE's 0 would wait forever)
        claims().release(task_id, queue, Claim("armed"))
        return Claim("released")
    with stop_signal.interruptible():
        return claims().wait(task_id, queue, timeout, pipeline().queue_read)


def _decode(task: Any, job_id: str, claimed: bool = False, read: list[Any] | None = None) -> DecodeOutcome:
    try:
        outcome = pipeline().run(job_id, task.request.id, read)
    except SoftTimeLimitExceeded:  # never leave the job "decoding": fail it with a reason
        outcome = pipeline().fail(job_id, "image decoding took too long", ErrorCode.BAD_IMAGE)
    except redis.RedisError as exc:  # Redis restarting: try again shortly, the job is intact
        if claimed:
            raise ClaimInterrupted(str(exc)) from exc
        if task.request.retries >= REDIS_RETRIES:
            outcome = _fail_quietly(job_id, f"job store unreachable while decoding: {exc}")
        else:
            raise task.retry(exc=exc, countdown=min(2**task.request.retries, 10)) from exc
    except Exception as exc:  # a bug or an unforeseen library error: the job must still end
        log.exception("job %s: unexpected error while decoding", job_id)
        outcome = _fail_quietly(job_id, f"internal error while decoding: {type(exc).__name__}: {exc}")
    ms = outcome.decode_s * 1000
    log.info("job %s: %s %s (%.1f ms, task %s)", job_id, outcome.status, outcome.detail, ms, task.request.id)
    return outcome


def _fail_quietly(job_id: str, reason: str) -> DecodeOutcome:
    """Fail the job (the task is acked either way); if even that fails, the error is logged."""
    try:
        return pipeline().fail(job_id, reason, ErrorCode.INTERNAL)
    except Exception:
        log.exception("job %s: could not record the failure", job_id)
        return DecodeOutcome("failed", reason)
