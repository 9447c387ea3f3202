"""The sweeper: every accepted job reaches a terminal state, whatever died on its way.

Every live inference worker runs it now and then; a Redis lock (``Keys.sweeper_lock``) lets one
sweep at a time. It reads the old end of the active-jobs set (jobs with no progress for
``stuck_after_s``) and moves each one on:

- record gone (a gateway died after admitting it): forget it;
- past its deadline and not generating: expired (nobody else may be reading it);
- queued or decoding: its decode task again (``REDECODE_LUA``; the task was lost with a decode
  worker's main process, or sits in its unacked set until the visibility timeout), up to
  ``max_decode_attempts``, then failed ``internal`` and dead-lettered;
- waiting or generating: a new stream entry if the old one is gone (the stream was deleted,
  flushed or evicted; ``REQUEUE_INFERENCE_LUA``); a live entry is only slow, and a dead
  consumer's entry is claimed by XAUTOCLAIM.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from services.inference_worker.job_store import JobStore
from shared import metrics_hash
from shared.config import InferenceSettings
from shared.decode_task import DecodeTasks
from shared.jobs import REDECODE_LUA, REQUEUE_INFERENCE_LUA, JobRecord, past_deadline
from shared.schemas import ErrorCode, JobStatus

log = logging.getLogger(__name__)
BATCH = 200  # stuck jobs handled per sweep
ENDED = {"expired": JobStatus.EXPIRED, "dead_lettered": JobStatus.FAILED}  # actions that end a job


class Sweeper:
    def __init__(
        self, client: Any, settings: InferenceSettings, worker_id: str, store: JobStore, tasks: DecodeTasks
    ) -> None:
        self.r = client
        self.settings = settings
        self.keys = settings.keys
        self.worker_id = worker_id
        self.store = store
        self.tasks = tasks  # the worker's: it sends jobs back to decoding too
        self.period_s = max(1.0, settings.stuck_after_s / 3)

    def sweep(self, now: float | None = None) -> Counter[str]:
        """One pass, if this worker holds the lock; returns what was done (action -> count)."""
        now = time.time() if now is None else now
        lock_ms = int(2000 * self.period_s)
        if not self.r.set(self.keys.sweeper_lock(), self.worker_id, nx=True, px=lock_ms):
            return Counter()
        cutoff = now - self.settings.stuck_after_s
        members = self.r.zrangebyscore(self.keys.active_jobs(), "-inf", cutoff, start=0, num=BATCH)
        done: Counter[str] = Counter()
        for member in members:
            done[self._one(member.decode(), now, cutoff)] += 1
        self._count(done)
        return done

    def _one(self, job_key: str, now: float, cutoff: float) -> str:
        raw = self.r.hgetall(job_key)
        if not raw or b"spec" not in raw:
            self.r.zrem(self.keys.active_jobs(), job_key)
            return "forgotten"
        record = JobRecord.from_hash(raw)
        job_id = record.spec.job_id
        if record.status.terminal:  # cannot happen through the scripts; keep the set true anyway
            self.r.zrem(self.keys.active_jobs(), job_key)
            return "forgotten"
        if record.status is not JobStatus.GENERATING and past_deadline(record.spec, now):
            error = f"deadline passed while {record.status.value}"
            ended = self.store.end(job_id, JobStatus.EXPIRED, ErrorCode.EXPIRED, error, 0, fenced=False)
            return "expired" if ended else "moved_on"
        if record.status in (JobStatus.QUEUED, JobStatus.DECODING):
            return self._redecode(job_key, job_id, now, cutoff)
        return self._requeue_inference(job_key, job_id, now, cutoff)

    def _redecode(self, job_key: str, job_id: str, now: float, cutoff: float) -> str:
        # Into the interactive queue, whatever the job's priority: a stuck batch job ages in.
        keys = [job_key, self.keys.active_jobs(), self.keys.decode_queue()]
        limit = self.settings.max_decode_attempts
        reply = int(
            self.r.eval(REDECODE_LUA, len(keys), *keys, now, cutoff, limit, self.tasks.message(job_id))
        )
        if reply == 1:
            log.warning(
                "job %s: no decode progress for %.0fs: decode task enqueued again", job_id, now - cutoff
            )
            return "redecoded"
        if reply == -1:
            reason = f"decoding did not complete after {limit} enqueues"
            self.store.dead_letter(job_id, "decode", limit, reason, fence=None)
            return "dead_lettered"
        return "moved_on"

    def _requeue_inference(self, job_key: str, job_id: str, now: float, cutoff: float) -> str:
        keys = [job_key, self.keys.active_jobs(), self.keys.inference_stream()]
        reply = int(self.r.eval(REQUEUE_INFERENCE_LUA, len(keys), *keys, now, cutoff, job_id))
        if reply == 2:
            log.warning("job %s: its inference stream entry was gone: enqueued again", job_id)
            return "requeued"
        return "alive" if reply == 1 else "moved_on"

    def _count(self, done: Counter[str]) -> None:
        acted = {k: v for k, v in done.items() if k not in ("alive", "moved_on")}
        if not acted:
            return
        key, pipe = self.keys.metrics_counters(), self.r.pipeline(transaction=False)
        for action, count in acted.items():
            metrics_hash.inc(pipe, key, "sweeper_actions_total", count, action=action)
            if outcome := ENDED.get(action):
                metrics_hash.inc(pipe, key, "jobs_total", count, outcome=outcome.value)
        pipe.execute()
