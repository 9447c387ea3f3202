"""Enqueues ``vlmq.decode(job_id)`` for the decode workers, straight from the event loop.

The message is the one Celery's ``send_task`` would publish (task protocol 2, JSON, in kombu's
Redis-transport envelope), built (``as_task_v2``) with a Celery app configured as the decode
workers' (``shared.decode_task``), and pushed with the gateway's asyncio Redis client: no broker
connection of Celery's own, no thread hop, and it can share a round trip (MULTI) with the
gateway's other writes. What kombu's Redis transport does on publish, and so what this does:
``LPUSH <global_keyprefix><queue> <envelope>`` (the default exchange ``""`` routes by queue name;
priority 0 is the queue's own list).
``tests/gateway/test_decode_queue.py`` checks the envelope against a real ``send_task``.

One difference from ``send_task``: no ``task-sent`` monitoring event is published (the worker's
``task-received``/``-started``/``-succeeded`` events still are, so Flower still shows every task).
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from celery import Celery
from kombu.serialization import dumps

from shared.config import DecodeWorkerSettings, GatewaySettings
from shared.decode_task import DECODE_QUEUE, DECODE_TASK, make_celery_app


def _worker_settings(settings: GatewaySettings) -> DecodeWorkerSettings:
    return DecodeWorkerSettings(
        _env_file=None,
        redis_url=settings.redis_url,  # type: ignore[call-arg]
        key_prefix=settings.key_prefix,
    )


class DecodeQueue:
    def __init__(self, settings: GatewaySettings) -> None:
        worker_settings = _worker_settings(settings)
        self.app: Celery = make_celery_app(worker_settings)
        self.key = worker_settings.keys.decode_queue()  # global_keyprefix + queue name

    def message(self, job_id: str, task_id: str | None = None) -> str:
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
                "delivery_info": {"exchange": "", "routing_key": DECODE_QUEUE},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        return json.dumps(envelope)

    def push(self, pipe: Any, job_id: str) -> None:
        """Queue the task's LPUSH on ``pipe`` (a Redis pipeline, sync or asyncio)."""
        pipe.lpush(self.key, self.message(job_id))

    def close(self) -> None:
        self.app.close()
