"""The decode task as both sides see it: its name, its queue, and the Celery app settings the
gateway (which enqueues) and the decode workers (which run it) must agree on.

The gateway builds its Celery app here, with no task modules (it enqueues by task name and never
imports ``worker``); the decode workers add ``worker.tasks`` to the same configuration.

Reliability settings, why each:
- JSON only, never pickle: a message can't execute code in a worker.
- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task whose process dies (SIGKILL,
  OOM on a bomb) goes back to the queue instead of vanishing.
- ``worker_prefetch_multiplier=1``: a busy child doesn't sit on tasks others could run.
- ``visibility_timeout``: an unacked task (its worker gone) is redelivered after that long.
- task events on, so Flower shows every task.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from shared.config import DecodeWorkerSettings

DECODE_TASK = "vlmq.decode"
DECODE_QUEUE = "decode"


def make_celery_app(settings: DecodeWorkerSettings, include: Sequence[str] = ()) -> Celery:
    """A Celery app on the settings' Redis with vlmq's broker and task settings."""
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
        worker_max_tasks_per_child=1000,  # bounds any slow leak in image libraries
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_default_queue=DECODE_QUEUE,
        task_routes={DECODE_TASK: {"queue": DECODE_QUEUE}},
        task_time_limit=120,
        task_soft_time_limit=90,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "global_keyprefix": settings.keys.celery_prefix(),  # queue list: keys.decode_queue()
        },
    )
    return app
