"""The Celery app of the decode workers: ``celery -A worker.celery_app worker -Q decode``.

Its configuration is ``shared.decode_task`` (the gateway enqueues with the same one); this app
adds the task module, imported by worker processes only (Pillow + image processor).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import after_setup_logger

from shared import log_context
from shared.config import DecodeWorkerSettings, get_decode_worker_settings
from shared.decode_task import make_celery_app


def make_app(settings: DecodeWorkerSettings | None = None) -> Celery:
    settings = settings or get_decode_worker_settings()
    app = make_celery_app(settings, include=["worker.tasks"], visibility_timeout_s=settings.visibility_timeout_s)
    app.conf.worker_pool = settings.decode_pool  # the default of the CLI's -P
    return app


app = make_app()
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] job=%(job_id)s %(message)s"


@after_setup_logger.connect
def _job_ids_in_logs(**_: Any) -> None:
    """Celery's worker log lines name the job too (``decode`` binds it for the task's run)."""
    log_context.install_on_root(LOG_FORMAT)
