"""The Celery app of the decode workers: ``celery -A worker.celery_app worker -Q decode``.

Its configuration is ``shared.decode_task`` (the gateway enqueues with the same one); this app
adds the task module, imported by worker processes only (Pillow + image processor).
"""

from __future__ import annotations

from celery import Celery

from shared.config import DecodeWorkerSettings, get_decode_worker_settings
from shared.decode_task import make_celery_app


def make_app(settings: DecodeWorkerSettings | None = None) -> Celery:
    settings = settings or get_decode_worker_settings()
    return make_celery_app(
        settings, include=["worker.tasks"], visibility_timeout_s=settings.visibility_timeout_s
    )


app = make_app()
