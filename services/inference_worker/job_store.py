"""Job records as the inference worker sees them: load, start an attempt (with the job's pixels),
published tokens.

Terminal states go through ``shared.jobs``' FINISH_LUA (``finish`` queues it on a pipeline, so
the writer thread can put it in the same round trip as the last token events). Every write of an
attempt is fenced with its number: once another attempt began, this one can no longer write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from services.engine.api import ImageInput
from services.inference_worker.engine_request import image_input
from shared.jobs import (
    BEGIN_ATTEMPT_LUA,
    FINISH_LUA,
    RETURN_TO_DECODING_LUA,
    SET_STATUS_LUA,
    JobRecord,
    finish_args,
    job_keys,
    pipe_script,
    record_dead_letter,
    status_args,
    terminal_event,
)
from shared.keys import INFERENCE_GROUP, Keys
from shared.schemas import ErrorCode, JobEvent, JobStatus
from shared.tensors import TensorCodecError, unpack_tensors
from shared.values import as_str


@dataclass(frozen=True)
class Begun:
    """A delivery's start: the job as loaded, its new attempt (0: already terminal), its cancel flag,
    its pixels as the decode worker stored them (None: none stored, or already terminal)."""

    record: JobRecord
    fields: dict[str, str]
    attempt: int
    cancelled: bool
    pixels: bytes | None = None


def _record(raw: dict[Any, Any]) -> tuple[JobRecord, dict[str, str]] | None:
    if not raw or (b"spec" not in raw and "spec" not in raw):
        return None
    fields = {as_str(k): as_str(v) for k, v in raw.items()}
    return JobRecord.from_hash(raw), fields


def begun(reply: Any) -> Begun | None:
    """A BEGIN_ATTEMPT_LUA reply as a ``Begun`` (None: the job is gone)."""
    if not reply:
        return None
    attempt, cancelled, flat, pixels = reply
    loaded = _record(dict(zip(flat[::2], flat[1::2], strict=True)))
    if loaded is None:
        return None
    return Begun(loaded[0], loaded[1], int(attempt), bool(cancelled), bytes(pixels) if pixels else None)


class JobStore:
    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int, image_ttl_s: int):
        self.r: Any = client  # redis-py's return types are unions; the shapes are known here
        self.keys = keys
        self.job_ttl_s = job_ttl_s
        self.image_ttl_s = image_ttl_s
        self._set_status = client.register_script(SET_STATUS_LUA)
        self._finish = client.register_script(FINISH_LUA)
        self._return = client.register_script(RETURN_TO_DECODING_LUA)

    # --- reads ---
    def begin(self, job_id: str) -> Begun | None:
        """One round trip: load the job, begin an attempt unless it is terminal, read its cancel flag
        and its pixels. None when the job is gone."""
        return begun(self.begin_many([job_id])[0])

    def begin_many(self, job_ids: list[str]) -> list[Any]:
        """``begin`` for several jobs in one round trip (entries read together): the raw replies,
        each read by ``begun`` (which raises on a malformed job: the caller fails that job only)."""
        if not job_ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            keys = [self.keys.job(job_id), self.keys.job_cancel(job_id), self.keys.job_pixels(job_id)]
            pipe_script(pipe, BEGIN_ATTEMPT_LUA, keys, [])
        return list(pipe.execute())

    def cancel_requested(self, job_ids: list[str]) -> list[str]:
        """Those of ``job_ids`` whose cancel flag is set (one MGET: polled every 50 ms)."""
        if not job_ids:
            return []
        flags = self.r.mget([self.keys.job_cancel(job_id) for job_id in job_ids])
        return [j for j, flag in zip(job_ids, flags, strict=True) if flag is not None]

    def published_tokens(self, job_id: str) -> list[int]:
        """Token ids already in the job's event stream (earlier attempts), in index order."""
        tokens: list[int] = []
        for _id, fields in self.r.xrange(self.keys.job_events(job_id)):
            event = JobEvent.from_fields(fields)
            if event.type != "token" or event.index is None or event.token_ids is None:
                continue
            if event.index == len(tokens):
                tokens.extend(event.token_ids)
            elif event.index + len(event.token_ids) > len(tokens):  # partial overlap: keep the new tail
                tokens.extend(event.token_ids[len(tokens) - event.index :])
        return tokens

    def legacy_image(self, digest: str, processor_id: str) -> ImageInput:
        """The previous release's decoded tensor of the image (its decode workers, still running in
        a rolling upgrade, store one per image digest); LookupError when there is none."""
        payload = self.r.get(self.keys.tensor(digest, processor_id))
        if payload is None:
            raise LookupError("decoded image expired before inference; submit the image again")
        try:
            return image_input(unpack_tensors(bytes(payload)), digest)
        except (TensorCodecError, KeyError) as exc:
            raise TensorCodecError(f"decoded image unreadable: {exc}") from exc

    # --- writes ---
    def set_status(self, job_id: str, status: JobStatus, attempt: int, client: Any = None) -> Any:
        """SET_STATUS_LUA fenced by ``attempt`` (refused once another attempt began); ``client``: a
        pipeline to queue it on (its reply comes with the pipeline's)."""
        args = status_args(status, time.time(), self.job_ttl_s, attempt, fence=attempt)
        if client is not None:
            return pipe_script(client, SET_STATUS_LUA, self.job_keys(job_id), args)
        return self._set_status(keys=self.job_keys(job_id), args=args)

    def finish(
        self, job_id: str, event: JobEvent, status: JobStatus, fence: int | None, client: Any = None
    ) -> Any:
        """FINISH_LUA: 1 written, 2 written before by this attempt, 0 already terminal, -1 fenced."""
        args = finish_args(event, status, time.time(), self.job_ttl_s, fence=fence)
        if client is not None:
            return pipe_script(client, FINISH_LUA, self.job_keys(job_id), args)
        return self._finish(keys=self.job_keys(job_id), args=args)

    def fail(
        self,
        job_id: str,
        reason: str,
        attempt: int,
        code: ErrorCode = ErrorCode.INTERNAL,
        fenced: bool = True,
    ) -> bool:
        return self.end(job_id, JobStatus.FAILED, code, reason, attempt, fenced)

    def end(
        self,
        job_id: str,
        status: JobStatus,
        code: ErrorCode,
        error: str | None,
        attempt: int,
        fenced: bool = True,
    ) -> bool:
        """Finish the job without a result (failed, cancelled, expired); True when this call wrote it."""
        event = terminal_event(status, code, error, attempt)
        return self.finish(job_id, event, status, attempt if fenced else None) in (1, 2)

    def return_to_decoding(
        self, job_id: str, attempt: int, task_message: str, stream: str, entry_id: str
    ) -> int:
        """``RETURN_TO_DECODING_LUA`` (fenced by ``attempt``): waiting or generating -> queued, its decode
        task pushed onto the interactive decode queue, its entry acknowledged. 1 returned, 0 nothing to
        return (entry acknowledged), -1 fenced (nothing written)."""
        keys = [self.keys.job(job_id), self.keys.active_jobs(), self.keys.decode_queue(), stream]
        args: list[str | float] = [time.time(), attempt, task_message, INFERENCE_GROUP, entry_id]
        return int(self._return(keys=keys, args=args))

    def dead_letter(self, job_id: str, stage: str, attempts: int, reason: str, fence: int | None) -> None:
        """Fail the job for good (``fence``: the attempt that passed the cap, None: unfenced) and
        record it in the dead letters."""
        self.fail(job_id, f"dead letter: {reason}", fence or 0, fenced=fence is not None)
        pipe = self.r.pipeline(transaction=False)
        record_dead_letter(pipe, self.keys, job_id, stage, attempts, reason)
        pipe.execute()

    def job_keys(self, job_id: str) -> list[str]:
        return job_keys(self.keys, job_id)
