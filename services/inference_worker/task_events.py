"""Celery task events for each job's inference stage, so Flower lists it beside the decode task.

The inference worker is no Celery worker, but Flower only reads events. Per attempt at a job,
task ``vlmq.inference`` (uuid ``inference-<job id>-<attempt>``, args ``[job id]``) from the node
``inference@<worker id>``: ``task-received`` and ``task-started`` when the job goes to the engine,
then ``task-succeeded`` (runtime, token count and finish reason; never the text),
``task-failed`` (the error) or ``task-revoked`` (cancelled, expired, or finished by another
attempt). ``worker-heartbeat`` with every heartbeat keeps the node online in Flower.

Off unless ``VLMQ_TASK_EVENTS`` (on wherever Flower runs: make up, compose, k8s): then callers put
events on a bounded queue and a daemon thread publishes them on its own broker connection (kombu
connections are not thread-safe); a broker error drops events: monitoring never slows or fails a job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from typing import Any

from services.inference_worker.after_finish import Finished
from shared.config import InferenceSettings
from shared.schemas import JobStatus

log = logging.getLogger(__name__)
TASK_NAME = "vlmq.inference"
MAX_QUEUED = 10_000
_STOP: tuple[str, dict[str, Any]] = ("", {})  # tells the thread to end


def task_id(job_id: str, attempt: int) -> str:
    return f"inference-{job_id}-{attempt}"


class TaskEvents:
    def __init__(self, settings: InferenceSettings, worker_id: str) -> None:
        self.enabled = settings.task_events
        self.settings = settings
        self.hostname = f"inference@{worker_id}"
        self.processed = 0
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._publish_all, name="task-events", daemon=True)

    # --- what the worker calls (cheap; no-ops when disabled) ---
    def start(self) -> None:
        if self.enabled:
            self._thread.start()
            self._put("worker-online", **self._worker_fields(0))

    def stop(self) -> None:
        if self.enabled and self._thread.is_alive():
            self._put("worker-offline", **self._worker_fields(0))
            self._queue.put(_STOP)
            self._thread.join(timeout=5)

    def job_started(self, job_id: str, attempt: int) -> None:
        uuid = task_id(job_id, attempt)
        self._put(
            "task-received", uuid=uuid, name=TASK_NAME, args=repr([job_id]), kwargs="{}", retries=attempt - 1
        )
        self._put("task-started", uuid=uuid)

    def job_ended(self, item: Finished) -> None:
        """The attempt's end; one that did not write the job's end (another attempt did) is revoked."""
        if not self.enabled:
            return
        run, event = item.run, item.event
        uuid, runtime = task_id(run.job_id, run.attempt), max(0.0, time.time() - run.submitted_at)
        status = item.status if item.wrote else None
        self.processed += 1
        if status is JobStatus.DONE:
            tokens = event.usage.completion_tokens if event.usage else len(run.token_ids)
            result = f"{tokens} tokens, {event.finish_reason or 'stop'}"
            self._put("task-succeeded", uuid=uuid, result=result, runtime=runtime)
        elif status is JobStatus.FAILED:
            exception = f"{event.error_code or 'failed'}: {event.error or ''}"
            self._put("task-failed", uuid=uuid, exception=exception, traceback="", runtime=runtime)
        else:
            expired = status is JobStatus.EXPIRED
            self._put("task-revoked", uuid=uuid, terminated=True, signum=None, expired=expired)

    def heartbeat(self, active: int) -> None:
        self._put("worker-heartbeat", **self._worker_fields(active))

    # --- the publishing thread ---
    def _put(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        with contextlib.suppress(queue.Full):  # the broker is stuck: drop (monitoring only)
            self._queue.put_nowait((kind, fields))

    def _worker_fields(self, active: int) -> dict[str, Any]:
        return {
            "freq": self.settings.heartbeat_s,
            "active": active,
            "processed": self.processed,
            "loadavg": list(os.getloadavg()),
            "sw_ident": "vlmq-inference",
            "sw_ver": "0.1.0",
            "sw_sys": os.uname().sysname,
        }

    def _publish_all(self) -> None:
        dispatcher: Any = None
        while (item := self._queue.get()) is not _STOP:
            try:
                dispatcher = dispatcher or self._connect()
                dispatcher.send(item[0], **item[1])
            except Exception as exc:  # the broker is down or restarting: drop, reconnect next time
                log.debug("task event %s dropped: %s", item[0], exc)
                _close(dispatcher)
                dispatcher = None
        _close(dispatcher)

    def _connect(self) -> Any:
        from shared.decode_task import make_celery_app  # celery only when events are on

        app = make_celery_app(self.settings)
        return app.events.Dispatcher(
            app.connection_for_write(), hostname=self.hostname, enabled=True, buffer_while_offline=False
        )


def _close(dispatcher: Any) -> None:
    if dispatcher is None:
        return
    try:
        dispatcher.close()
        dispatcher.connection.release()
    except Exception:  # closing a broken connection
        log.debug("closing the task-event connection failed", exc_info=True)
