"""The Celery app of the decode workers: ``celery -A worker.celery_app worker -Q decode``.

Its configuration is ``shared.decode_task`` (the gateway enqueues with the same one); this app
adds the task module, imported by worker processes only (Pillow + image processor).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger

from shared import log_context
from shared.config import DecodeWorkerSettings, get_decode_worker_settings
from shared.decode_task import make_celery_app


def make_app(settings: DecodeWorkerSettings | None = None) -> Celery:
    settings = settings or get_decode_worker_settings()
    timeout = settings.visibility_timeout_s if settings.decode_ack_emulation else None
    app = make_celery_app(settings, include=["worker.tasks"], visibility_timeout_s=timeout)
    app.conf.worker_pool = settings.decode_pool  # the default of the CLI's -P
    return app


app = make_app()
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] job=%(job_id)s %(message)s"
# Celery's "Task ... received" and "... succeeded in" lines: two INFO records a job beside the
# decode task's own line (job, task id, outcome, time); the first is written by the parent before it
# hands the task to a child, on every job's path (~0.4 ms at one client, bench/README.md).
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


@after_setup_logger.connect
def _job_ids_in_logs(loglevel: int | str = logging.INFO, **_: Any) -> None:
    """Celery's worker log lines name the job too (``decode`` binds it for the task's run); Celery's
    per-task INFO lines show at DEBUG only (their warnings and errors always)."""
    log_context.install_on_root(LOG_FORMAT)
    level = logging.getLevelName(loglevel.upper()) if isinstance(loglevel, str) else loglevel
    if isinstance(level, int) and level > logging.DEBUG:
        for name in PER_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
