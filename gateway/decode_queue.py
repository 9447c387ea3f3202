"""Sends ``vlmq.decode(job_id)`` through the decode workers' own Celery app configuration.

Celery's producer is blocking, so sends run on one dedicated thread: the event loop never
waits on the broker, and sends never share a connection across threads.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from celery import Celery

from shared.config import DecodeWorkerSettings, GatewaySettings
from worker.celery_app import DECODE_QUEUE, DECODE_TASK, make_app

# Bounded retries: an unreachable broker must turn into a 503, not a hung request.
_RETRY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.5}


def _worker_settings(settings: GatewaySettings) -> DecodeWorkerSettings:
    return DecodeWorkerSettings(
        _env_file=None,
        redis_url=settings.redis_url,  # type: ignore[call-arg]
        key_prefix=settings.key_prefix,
    )


class DecodeQueue:
    def __init__(self, settings: GatewaySettings) -> None:
        worker_settings = _worker_settings(settings)
        self.app: Celery = make_app(worker_settings)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="celery-send")

    def _send(self, job_id: str) -> str:
        result = self.app.send_task(
            DECODE_TASK, args=[job_id], queue=DECODE_QUEUE, retry=True, retry_policy=_RETRY
        )
        return str(result.id)

    async def enqueue(self, job_id: str) -> str:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._send, job_id)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.app.close()
