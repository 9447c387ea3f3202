"""The writer thread: engine events -> Redis, batched per step.

The engine calls ``EventWriter.put`` from its own thread for every request at every decode
step; ``put`` only enqueues, so decoding never waits on Redis. The writer drains whatever has
accumulated (one engine step for the whole batch, usually) and writes it in one MULTI/EXEC:
token events (APPEND_TOKENS_LUA: XADDs + one wake-up per job, refused once the job is terminal),
and FINISH_LUA for jobs that ended. A second
round trip then records the session, the result cache and the metrics of the jobs whose
terminal state this worker wrote, and acknowledges their stream entries (XACK after FINISH).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from services.engine.api import FinishReason, TokenEvent
from services.adapter.store import JobStore
from services.adapter.stream import Entry, StreamConsumer
from shared import metrics_hash, result_cache, sessions
from shared.jobs import EVENTS_MAXLEN
from shared.keys import Keys
from shared.schemas import EventType, JobEvent, JobSpec, JobStatus, StageTimings, UsageInfo

log = logging.getLogger(__name__)
MAX_BATCH_EVENTS = 512

# KEYS: job hash, events stream, wake channel. ARGV[1]: maxlen; ARGV[2..]: token event JSON.
# Appends only while the job is not terminal (nothing lands after cancelled/expired/done), then
# one wake-up. Returns 0 when refused: the writer then cancels the engine request.
APPEND_TOKENS_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or status == 'done' or status == 'failed' or status == 'cancelled' or status == 'expired' then
  return 0
end
local id
for i = 2, #ARGV do id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[i]) end
redis.call('PUBLISH', KEYS[3], id)
return 1
"""


@dataclass
class JobRun:
    """One attempt at one job on this worker: what the writer needs to publish and finish it."""

    entry: Entry
    spec: JobSpec
    attempt: int
    request_id: str
    published: list[int]  # token ids an earlier attempt already put in the stream
    queue_s: float = 0.0
    decode_s: float = 0.0
    waiting_at: float | None = None
    submitted_at: float = field(default_factory=time.time)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    generating: bool = False
    diverged: str | None = None
    cancel_sent: bool = False
    released: bool = False  # handed back on shutdown: its events are ignored

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def text(self) -> str:
        return "".join(self.texts)


@dataclass(frozen=True)
class WriterConfig:
    model_name: str
    session_ttl_s: int
    result_cache_ttl_s: int


class EventWriter(threading.Thread):
    def __init__(
        self,
        client: redis.Redis,
        store: JobStore,
        consumer: StreamConsumer,
        config: WriterConfig,
        on_finished: Callable[[JobRun], None],
        cancel: Callable[[str], object],
    ) -> None:
        super().__init__(name="event-writer", daemon=True)
        self.r: Any = client  # redis-py's return types are unions; this module knows the shapes
        self.store = store
        self.keys: Keys = store.keys
        self.consumer = consumer
        self.config = config
        self.on_finished = on_finished
        self.cancel = cancel
        self._queue: queue.Queue[tuple[JobRun, TokenEvent]] = queue.Queue()
        self._halt = threading.Event()
        self._append_tokens = client.register_script(APPEND_TOKENS_LUA)
        self.flushes = 0  # round trips (one MULTI/EXEC each)
        self.events = 0  # engine events written: events/flushes = batching per round trip

    def put(self, run: JobRun, event: TokenEvent) -> None:
        """Called from the engine thread: never blocks."""
        self._queue.put((run, event))

    def stop(self, timeout_s: float = 10.0) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        while not (self._halt.is_set() and self._queue.empty()):
            batch = self._drain()
            if batch:
                self._flush_with_retry(batch)

    def _drain(self) -> list[tuple[JobRun, TokenEvent]]:
        try:
            batch = [self._queue.get(timeout=0.05)]
        except queue.Empty:
            return []
        while len(batch) < MAX_BATCH_EVENTS:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _flush_with_retry(self, batch: list[tuple[JobRun, TokenEvent]]) -> None:
        delay = 0.1
        while True:
            try:
                self.flush(batch)
                return
            except redis.RedisError as exc:  # Redis restarting: keep the events, try again
                log.warning("event write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # --- one round of writes ---
    def flush(self, batch: list[tuple[JobRun, TokenEvent]]) -> None:
        pipe = self.r.pipeline(transaction=True)
        finished: list[tuple[JobRun, JobEvent, JobStatus, int]] = []
        appends: list[tuple[JobRun, int]] = []
        pending: dict[str, tuple[JobRun, list[str]]] = {}
        for run, event in batch:
            if run.released:
                continue
            if not run.generating:
                run.generating = True
                self.store.set_status(run.job_id, JobStatus.GENERATING, run.attempt, client=pipe)
            if (data := self._tokens(run, event)) is not None:
                pending.setdefault(run.job_id, (run, []))[1].append(data)
            if event.finished:
                appends += self._append(pipe, pending.pop(run.job_id, None))  # tokens before the end
                terminal, status = self._terminal(run, event)
                finished.append((run, terminal, status, len(pipe.command_stack)))
                self.store.finish(run.job_id, terminal, status, client=pipe)
        for item in pending.values():
            appends += self._append(pipe, item)
        results = pipe.execute()
        self.flushes += 1
        self.events += len(batch)
        for run, i in appends:
            if not results[i] and not run.cancel_sent:  # already terminal (cancelled by the gateway)
                run.cancel_sent = True
                self.cancel(run.request_id)
        if finished:
            self._after_finish([(run, ev, st, bool(results[i])) for run, ev, st, i in finished])

    def _append(
        self, pipe: redis.client.Pipeline, item: tuple[JobRun, list[str]] | None
    ) -> list[tuple[JobRun, int]]:
        """Queue one APPEND_TOKENS_LUA call for a job's new token events; (run, result index)."""
        if item is None:
            return []
        run, datas = item
        index = len(pipe.command_stack)
        self._append_tokens(keys=self.store.job_keys(run.job_id), args=[EVENTS_MAXLEN, *datas], client=pipe)
        return [(run, index)]

    def _tokens(self, run: JobRun, event: TokenEvent) -> str | None:
        """Record the event's tokens; the token event to publish, unless an earlier attempt already did."""
        ids = list(event.token_ids)
        if run.diverged or (not ids and not event.text):
            return None
        start = event.index
        overlap = run.published[start : start + len(ids)]
        if overlap != ids[: len(overlap)]:
            run.diverged = f"retry diverged from the tokens already streamed at index {start}"
            self.cancel(run.request_id)
            return None
        run.token_ids.extend(ids)
        run.texts.append(event.text)
        run.first_token_at = run.first_token_at or time.time()
        if start + len(ids) <= len(run.published):
            return None  # the client already has these
        token = JobEvent(type="token", attempt=run.attempt, text=event.text, token_ids=ids, index=start)
        return token.to_fields()["data"]

    def _terminal(self, run: JobRun, event: TokenEvent) -> tuple[JobEvent, JobStatus]:
        """The terminal event for the engine's last event (the stream's done/error/status entry)."""
        kind, status, reason, error = _outcome(run, event)
        terminal = JobEvent(
            type=kind,
            status=status,
            finish_reason=reason,
            error=error,
            attempt=run.attempt,
            final_text=run.text,
            usage=_usage(event),
            timings=self._timings(run, event),
        )
        return terminal, status

    def _timings(self, run: JobRun, event: TokenEvent) -> StageTimings:
        engine = event.timings
        now, created = time.time(), run.spec.created_at
        waited = run.submitted_at - (run.waiting_at or run.submitted_at)
        return StageTimings(
            queue=run.queue_s,
            decode=run.decode_s,
            wait=max(0.0, waited) + (engine.queue if engine else 0.0),
            vision=engine.vision if engine else 0.0,
            prefill=engine.prefill if engine else 0.0,
            generation=engine.generation if engine else 0.0,
            ttft=(run.first_token_at - created) if run.first_token_at else 0.0,
            total=now - created,
        )

    def _after_finish(self, done: list[tuple[JobRun, JobEvent, JobStatus, bool]]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for run, event, status, wrote in done:
            if wrote:  # this attempt wrote the terminal state: its side effects happen once
                self._side_effects(pipe, run, event, status)
            self.consumer.ack(pipe, run.entry.entry_id)
        pipe.execute()
        for run, _event, status, wrote in done:
            log.info(
                "job %s attempt %d: %s%s (%d tokens)",
                run.job_id,
                run.attempt,
                status.value,
                "" if wrote else " (already terminal)",
                len(run.token_ids),
            )
            self.on_finished(run)

    def _side_effects(
        self, pipe: redis.client.Pipeline, run: JobRun, event: JobEvent, status: JobStatus
    ) -> None:
        key = self.keys.metrics_counters()
        metrics_hash.inc(pipe, key, "jobs_total", outcome=status.value)
        if status is not JobStatus.DONE:
            return
        sessions.record_turn(pipe, self.keys, run.spec, run.text, self.config.session_ttl_s)
        cache_key = result_cache.cache_key(self.keys, self.config.model_name, run.spec)
        if cache_key and event.usage is not None:
            record = result_cache.CachedResult(
                text=run.text, usage=event.usage, finish_reason=event.finish_reason or "stop"
            )
            pipe.set(cache_key, result_cache.encode(record), ex=self.config.result_cache_ttl_s)
        if event.usage is not None:
            for kind in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                metrics_hash.inc(
                    pipe, key, "tokens_total", getattr(event.usage, kind), kind=kind.split("_")[0]
                )
        if event.timings is not None:
            for stage, seconds in event.timings.model_dump().items():
                metrics_hash.observe(pipe, key, "stage_seconds", seconds, stage=stage)


def _outcome(run: JobRun, event: TokenEvent) -> tuple[EventType, JobStatus, str, str | None]:
    """(event type, job status, finish reason, error) of a finished attempt."""
    reason = event.finish_reason
    if run.diverged:
        return "error", JobStatus.FAILED, "error", run.diverged
    if reason in (FinishReason.STOP, FinishReason.LENGTH):
        return "done", JobStatus.DONE, str(reason), None
    if reason is FinishReason.CANCELLED:
        return "status", JobStatus.CANCELLED, "cancelled", None
    if reason is FinishReason.EXPIRED:
        return "status", JobStatus.EXPIRED, "expired", "deadline passed during generation"
    return "error", JobStatus.FAILED, "error", event.error or "generation failed"


def _usage(event: TokenEvent) -> UsageInfo | None:
    if event.usage is None:
        return None
    u = event.usage
    return UsageInfo(
        prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens, cached_tokens=u.cached_tokens
    )
