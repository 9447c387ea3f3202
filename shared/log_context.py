"""Every log line carries the job id it is about (``job=<id>``, ``job=-`` for none).

A context variable holds the job being worked on (``with job(job_id):``: a request's task, a
Celery task, one stream entry); a filter on the root logger's handlers copies it into each record,
so the format can name ``%(job_id)s``. Context variables follow asyncio tasks and stay per thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

FORMAT = "%(asctime)s %(levelname)s %(name)s job=%(job_id)s: %(message)s"
JOB_ID: ContextVar[str] = ContextVar("vlmq_job_id", default="-")


class JobIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "job_id"):
            record.job_id = JOB_ID.get()
        return True


def configure(level: str) -> None:
    """basicConfig with the job id in every line (the root logger's handlers)."""
    logging.basicConfig(level=level.upper(), format=FORMAT)
    install_on_root()


def install_on_root(fmt: str | None = None) -> None:
    """Add the filter (and, when given, a format) to every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, JobIdFilter) for f in handler.filters):
            handler.addFilter(JobIdFilter())
        if fmt is not None:
            handler.setFormatter(logging.Formatter(fmt))


def bind(job_id: str) -> None:
    """The rest of this task (or thread) is about ``job_id``."""
    JOB_ID.set(job_id)


@contextmanager
def job(job_id: str) -> Iterator[None]:
    token = JOB_ID.set(job_id)
    try:
        yield
    finally:
        JOB_ID.reset(token)
