"""The decode task as both sides see it: its name, its queue, and the Celery app settings the
gateway (which enqueues) and the decode workers (which run it) must agree on.

The gateway and the inference worker's sweeper enqueue with ``DecodeTasks`` (by task name, never
importing ``worker``); the decode workers add ``worker.tasks`` to the same configuration.

Reliability settings, why each:
- JSON only, never pickle: a message can't execute code in a worker.
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task whose process dies (SIGKILL,
  OOM on a bomb) goes back to the queue instead of vanishing.
- ``worker_prefetch_multiplier=1``: a busy child doesn't sit on tasks others could run.
- No acknowledgement emulation by default (``VLMQ_DECODE_ACK_EMULATION``): kombu's emulation keeps
  each fetched task in an unacked hash (one MULTI when the main process takes it, before it
  reaches a child; one more on the ack) to redeliver it after ``visibility_timeout`` if its whole
  node dies. Without it a killed pool child's task is still requeued at once (reject on worker
  lost), and a dead node's jobs come back through the inference workers' sweeper, which
  re-enqueues a job stuck in ``queued``/``decoding`` after ``VLMQ_STUCK_AFTER_S`` (30 s; the
  visibility timeout is 300 s).
- task events only where Flower runs (the worker's ``-E``: `make up`, compose, k8s): each task
  otherwise costs a few event publishes nobody reads. Rate limits off (none are set): no token
  bucket per task.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu.serialization import dumps

from shared.config import CommonSettings
from shared.redis_clients import parse_sentinel_url

DECODE_TASK = "vlmq.decode"
DECODE_QUEUE = "decode"  # interactive work
BATCH_QUEUE = "decode.batch"  # batch work: a decode worker takes it when ``decode`` is empty
QUEUES = (DECODE_QUEUE, BATCH_QUEUE)  # in the order workers consume them
MAX_CHILD_RSS_KB = 1_500_000  # a decode child's resident memory (KiB) before it is replaced


def queue_for(priority: str) -> str:
    return BATCH_QUEUE if priority == "batch" else DECODE_QUEUE


def make_celery_app(
    settings: CommonSettings, include: Sequence[str] = (), visibility_timeout_s: int | None = None
) -> Celery:
    """A Celery app on the settings' Redis with vlmq's broker and task settings.

    ``visibility_timeout_s`` matters to consumers only: the decode workers pass theirs when they
    emulate acknowledgements (``VLMQ_DECODE_ACK_EMULATION``); None turns the emulation off."""
    # the queue list is then keys.decode_queue()
    # "priority": every fetch asks the queues in QUEUES' order, so batch waits for interactive
    transport: dict[str, Any] = {
        "global_keyprefix": settings.keys.celery_prefix(),
        "queue_order_strategy": "priority",
        **sentinel_transport(settings),
    }
    if visibility_timeout_s is not None:
        transport["visibility_timeout"] = visibility_timeout_s
    else:  # no unacked hash: two round trips less per task in the consumer (see the list above)
        transport["ack_emulation"] = False
    app = Celery("vlmq", broker=settings.redis_url, include=list(include))
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,  # results live in the job hash, not in a Celery backend
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        # A child is replaced when it grows past this (a slow leak in an image library), not every
        # N tasks: children share the load evenly, so a task count recycled them all at once and
        # every job queued meanwhile waited for the new children's warm-up (the soak's p99 spikes).
        worker_max_memory_per_child=MAX_CHILD_RSS_KB,
        worker_disable_rate_limits=True,
        task_default_queue=DECODE_QUEUE,
        task_routes={DECODE_TASK: {"queue": DECODE_QUEUE}},
        task_time_limit=120,
        task_soft_time_limit=90,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport,
    )
    return app


def sentinel_transport(settings: CommonSettings) -> dict[str, Any]:
    """kombu's sentinel transport options for a ``sentinel://`` broker URL (none otherwise)."""
    if parse_sentinel_url(settings.redis_url) is None:
        return {}
    options: dict[str, Any] = {"master_name": settings.redis_sentinel_master}
    if settings.redis_sentinel_password:  # the URL's password is the Redis servers', not the sentinels'
        options["sentinel_kwargs"] = {"password": settings.redis_sentinel_password}
    return options


class DecodeTasks:
    """Enqueues ``vlmq.decode(job_id)`` with a plain Redis client (the gateway's asyncio one, or the
    sweeper's): an LPUSH that can share a MULTI or a Lua script with the caller's other writes.

    The message is the one Celery's ``send_task`` would publish (task protocol 2, JSON, in kombu's
    Redis-transport envelope), built (``as_task_v2``) with a Celery app configured as the decode
    workers' (``shared.decode_task``), and pushed with the gateway's asyncio Redis client: no broker
    connection of Celery's own, no thread hop, and it can share a round trip (MULTI) with the
    gateway's other writes. What kombu's Redis transport does on publish, and so what this does:
    ``LPUSH <global_keyprefix><queue> <envelope>`` (the default exchange ``""`` routes by queue name;
    priority 0 is the queue's own list).
    ``tests/shared/test_decode_task.py`` checks the envelope against a real ``send_task``.

    One difference from ``send_task``: no ``task-sent`` monitoring event is published (the worker's
    ``task-received``/``-started``/``-succeeded`` events still are, so Flower still shows every task).
    """

    def __init__(self, settings: CommonSettings) -> None:
        self.app: Celery = make_celery_app(settings)
        self.keys = settings.keys

    def message(self, job_id: str, queue: str = DECODE_QUEUE, task_id: str | None = None) -> str:
        """The kombu Redis envelope of one ``vlmq.decode(job_id)`` task (a JSON string)."""
        task_id = task_id or str(uuid.uuid4())
        headers, properties, body, _sent = self.app.amqp.as_task_v2(
            task_id, DECODE_TASK, args=[job_id], kwargs={}, reply_to=self.app.thread_oid, ignore_result=None
        )
        content_type, encoding, payload = dumps(body, serializer="json")
        raw = payload if isinstance(payload, bytes) else payload.encode(encoding)
        envelope: dict[str, Any] = {
            "body": base64.b64encode(raw).decode("ascii"),
            "content-encoding": encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                **properties,
                "delivery_mode": 2,  # persistent
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        return json.dumps(envelope)

    def push(self, pipe: Any, job_id: str, priority: str = "interactive") -> None:
        """Queue the task's LPUSH on ``pipe`` (a Redis pipeline, sync or asyncio)."""
        queue = queue_for(priority)
        pipe.lpush(self.keys.decode_queue(queue), self.message(job_id, queue))

    def close(self) -> None:
        self.app.close()
