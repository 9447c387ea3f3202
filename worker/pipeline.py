"""One decode job against Redis: the steps of docs/service-contract.md §2, no Celery in here.

``DecodePipeline.run(job_id)`` returns what happened ("waiting", "failed", ...); it writes the
job's state only through the scripts of ``shared.jobs``; ``HANDOFF_LUA`` moves the job to
``waiting`` and enqueues it for inference atomically (a worker killed between the two steps must
not leave a job waiting with no stream entry, nor enqueue it twice).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from services.vlm.image_processor import ImageProcessorHandle
from shared import metrics_hash
from shared.config import DecodeWorkerSettings
from shared.decode_task import QUEUES
from shared.jobs import (
    FINISH_LUA,
    HANDOFF_LUA,
    ROUTE_LUA,
    SET_STATUS_LUA,
    JobRecord,
    finish_call,
    job_keys,
    pipe_script,
    record_dead_letter,
    refusal,
    status_args,
    terminal_event,
)
from shared.jobs.routing import route_keys, stream_for
from shared.keys import Keys
from shared.schemas import ErrorCode, JobSpec, JobStatus
from shared.tensors import pack_images
from worker.imaging import ImageRejected, decode_image

log = logging.getLogger(__name__)

HANDED_OVER = frozenset({JobStatus.WAITING, JobStatus.GENERATING})


@dataclass
class DecodeOutcome:
    status: str  # waiting | failed | cancelled | expired | skipped | missing
    detail: str = ""
    decode_s: float = 0.0
    # seen at the hand-over: decode tasks wait in the queues, or the running task holds a claim
    # from an earlier delivery (``worker.claims``); True where the hand-over did not look
    claims_due: bool = True


class DecodePipeline:
    def __init__(self, client: redis.Redis, settings: DecodeWorkerSettings, processor: ImageProcessorHandle):
        self.r: Any = client  # redis-py's return types are unions; the shapes are known here
        self.settings = settings
        self.keys: Keys = settings.keys
        self.processor = processor
        self._finish = client.register_script(FINISH_LUA)

    def queue_read(self, pipe: Any, job_id: str) -> None:
        """The job's first read (its hash, its cancel flag), queued on ``pipe``."""
        pipe.hgetall(self.keys.job(job_id))
        pipe.exists(self.keys.job_cancel(job_id))

    def run(self, job_id: str, task_id: str = "", read: list[Any] | None = None) -> DecodeOutcome:
        """Three round trips around the decode: read the job, start decoding (+ fetch the image
        bytes), hand over (+ store the job's pixels). ``task_id``: the decode task running it (its own
        or one that claimed it, ``worker.claims``), kept in the job hash as ``decode_task``. ``read``:
        the replies of ``queue_read``, where they came with the claim (one round trip less)."""
        key = self.keys.job(job_id)
        if read is None:
            pipe = self.r.pipeline(transaction=False)
            self.queue_read(pipe, job_id)
            read = pipe.execute()
        raw, cancelled = read
        if not raw:
            return DecodeOutcome("missing", "job record not found (expired?)")
        job = JobRecord.from_hash(raw)
        if job.status.terminal or job.status in HANDED_OVER:
            return DecodeOutcome("skipped", f"job already {job.status.value}")
        if stop := self._stop_reason(job, bool(cancelled)):
            return stop
        started = time.time()
        digests = job.spec.image_digests()  # each image once, however many turns show it
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(key, "decode_attempts", 1)
        pipe.hset(key, "decode_started_at", str(started))
        pipe_script(
            pipe, SET_STATUS_LUA, self._job_keys(job_id), status_args(JobStatus.DECODING, started, self._ttl)
        )
        self._route(pipe, job.spec, started)
        for digest in digests:  # the bytes, their TTL renewed: a later turn may decode them again
            pipe.getex(self.keys.image(digest), ex=self.settings.image_ttl_s)
        replies = pipe.execute()
        attempts, owner = int(replies[0]), replies[3]
        if attempts > self.settings.max_decode_attempts:
            return self._dead_letter(job_id, attempts - 1)
        packed = None
        if digests:
            if any(data is None for data in replies[4:]):
                reason = "image bytes expired before decoding; submit the image again"
                return self.fail(job_id, reason, ErrorCode.IMAGE_EXPIRED)
            try:
                images = [self.decode_bytes(bytes(data)) for data in replies[4:]]
            except ImageRejected as exc:
                return self.fail(job_id, str(exc), exc.code)
            packed = pack_images(self.processor.processor_id, images)
        decode_s = time.time() - started
        return self._hand_over(job_id, decode_s, packed, self._stream_for(job.spec, owner), task_id)

    # --- steps ---
    def _route(self, pipe: Any, spec: JobSpec, now: float) -> None:
        """Queue ``ROUTE_LUA``: the live worker holding the job's session KV or image features."""
        pipe_script(pipe, ROUTE_LUA, route_keys(self.keys, spec), [now - self.settings.worker_stale_s])

    def _stream_for(self, spec: JobSpec, owner: bytes | None) -> str:
        return stream_for(self.keys, spec, owner, self.settings.affinity_routing)

    def _stop_reason(self, job: JobRecord, cancelled: bool) -> DecodeOutcome | None:
        """Cancelled by the client or past its deadline: finish now, never decode."""
        refused = refusal(job.spec, cancelled, before="decoding")
        if refused is None:
            return None
        self._finish_status(job.spec.job_id, refused.status, refused.error, refused.code)
        return DecodeOutcome(refused.status.value)

    def decode_bytes(self, data: bytes) -> dict[str, Any]:
        """The image's pixels as the wire carries them (``ImageProcessorHandle.wire``)."""
        settings = self.settings
        img = decode_image(
            data,
            settings.max_image_pixels,
            self.processor.target_pixels,
            draft=settings.jpeg_draft,
            oversample=settings.jpeg_draft_oversample,
        )
        try:
            return self.processor.wire(img)
        except Exception as exc:  # e.g. extreme aspect ratios; any failure here is the image's
            raise ImageRejected(f"image could not be processed: {exc}") from exc

    def _hand_over(
        self, job_id: str, decode_s: float, packed: bytes | None, stream: str, task_id: str
    ) -> DecodeOutcome:
        """One MULTI: the decode timing, then ``HANDOFF_LUA`` (which stores the pixels if it hands
        the job over: none are left behind for a job that changed state meanwhile)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.keys.job(job_id), mapping={"decode_s": f"{decode_s:.6f}", "decode_task": task_id})
        keys = [*self._job_keys(job_id), stream]
        args: list[Any] = [*status_args(JobStatus.WAITING, time.time(), self._ttl), job_id]
        if packed is not None:  # kept no longer than a job can live; FINISH_LUA deletes them sooner
            keys.append(self.keys.job_pixels(job_id))
            args += [packed, int(self.settings.max_job_s) + 60]
        pipe_script(pipe, HANDOFF_LUA, keys, args)
        # a list exists while it holds messages: one EXISTS tells whether a claim can find work
        pipe.exists(self.keys.decode_claim(task_id), *[self.keys.decode_queue(q) for q in QUEUES])
        _set, handed_over, due = pipe.execute()
        if not handed_over:
            return DecodeOutcome("skipped", "job changed state while decoding", decode_s, bool(due))
        return DecodeOutcome("waiting", "", decode_s, bool(due))

    def _dead_letter(self, job_id: str, interrupted: int) -> DecodeOutcome:
        reason = f"decoding this image was interrupted {interrupted} times"
        outcome = self.fail(job_id, f"dead letter: {reason}", ErrorCode.BAD_IMAGE)
        pipe = self.r.pipeline(transaction=False)
        record_dead_letter(pipe, self.keys, job_id, "decode", interrupted, reason)
        pipe.execute()
        return outcome

    def fail(self, job_id: str, reason: str, code: ErrorCode = ErrorCode.INTERNAL) -> DecodeOutcome:
        self._finish_status(job_id, JobStatus.FAILED, reason, code)
        return DecodeOutcome("failed", reason)

    def _finish_status(self, job_id: str, status: JobStatus, error: str | None, code: ErrorCode) -> None:
        event = terminal_event(status, code, error)
        keys, args = finish_call(self.keys, job_id, event, status, self._ttl)
        if self._finish(keys=keys, args=args) == 1:
            metrics_hash.inc(self.r, self.keys.metrics_counters(), "jobs_total", outcome=status.value)

    # --- helpers ---
    @property
    def _ttl(self) -> int:
        return self.settings.job_ttl_s

    def _job_keys(self, job_id: str) -> list[str]:
        return job_keys(self.keys, job_id)


__all__ = ["DecodeOutcome", "DecodePipeline"]
