"""The writer thread: engine events -> Redis, batched per step.

The engine calls ``EventWriter.put`` from its own thread for every request at every decode
step, and ``step_done`` after each step; both only enqueue, so decoding never waits on Redis. The
writer drains whole steps (every sequence's events of one step, or of several when it was busy
writing) and writes them in one MULTI/EXEC:
token events (``APPEND_TOKENS_LUA``) and ``FINISH_LUA`` for jobs that ended, fenced by the
attempt. Build -> execute -> apply: a ``JobRun`` changes only after its writes succeeded, and
every write is idempotent (already published indices are skipped; a re-sent FINISH of the same
attempt answers 2), so a write retried after a lost connection never duplicates anything.
A second round trip (``finish.after_finish``) records session, result cache and metrics of the
jobs whose terminal state this attempt wrote, and acknowledges their stream entries.

Only connection errors and timeouts are retried (Redis restarting); any other Redis error fails
the affected jobs and marks this writer (and so the worker's heartbeat) unhealthy until a later
write goes through.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from services.engine.api import FinishReason, TokenEvent
from services.inference_worker.after_finish import Finished, FinishEffects, WriterConfig
from services.inference_worker.job_run import JobRun, outcome, usage_info
from services.inference_worker.job_store import JobStore
from services.inference_worker.stream_consumer import StreamConsumer
from shared.jobs import APPEND_TOKENS_LUA, EVENTS_MAXLEN, pipe_script
from shared.schemas import JobEvent, JobStatus, StageTimings

log = logging.getLogger(__name__)
MAX_BATCH_EVENTS = 512
STEP = object()  # queued after a step's events (``step_done``)
STEP_WAIT_S = 0.05  # longest wait for a step's mark (events outside a step: an engine that runs no more)
RETRYABLE = (redis.ConnectionError, redis.TimeoutError)
T = TypeVar("T")

__all__ = ["EventWriter", "JobRun", "WriterConfig"]


@dataclass
class _PendingTokens:
    """Tokens ``start``.. of the attempt and their text, to publish as one token event."""

    start: int
    ids: list[int]
    text: str

    @property
    def end(self) -> int:
        return self.start + len(self.ids)


@dataclass
class _Part:
    """One job's share of a flush: what will be written, applied to the run once it was."""

    run: JobRun
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    events: list[_PendingTokens] = field(default_factory=list)  # to publish, in order
    first_token_at: float | None = None
    diverged: str | None = None
    starts_generating: bool = False
    append_at: int | None = None  # index of the APPEND result in the pipeline's replies
    finish: tuple[JobEvent, JobStatus, int] | None = None  # terminal event, status, reply index

    def recorded(self) -> int:
        return len(self.run.token_ids) + len(self.ids)

    def publish(self, start: int, ids: list[int], text: str) -> None:
        """Queue tokens ``start``.. for the stream, joined to the event before them where they
        continue it (one stream entry for the steps of one write). An event that starts inside what
        an earlier attempt published (which ``APPEND_TOKENS_LUA`` skips whole) takes nothing more."""
        last = self.events[-1] if self.events else None
        if last is not None and last.end == start and last.start >= len(self.run.published):
            last.ids.extend(ids)
            last.text += text
        else:
            self.events.append(_PendingTokens(start, list(ids), text))

    def append_args(self) -> list[str]:
        """``APPEND_TOKENS_LUA``'s triples: start, end, the token event's JSON."""
        args: list[str] = []
        for e in self.events:
            token = JobEvent(
                type="token", attempt=self.run.attempt, text=e.text, token_ids=e.ids, index=e.start
            )
            args += [str(e.start), str(e.end), token.to_fields()["data"]]
        return args


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
        self.effects = FinishEffects(client, store.keys, consumer, config)
        self.stream_interval_s = config.stream_interval_s
        self._last_flush = 0.0  # time.monotonic() of the last write
        self.on_finished = on_finished
        self.cancel = cancel
        self._queue: queue.Queue[tuple[JobRun, TokenEvent] | object] = queue.Queue()
        self._unmarked = False  # events put since the last step mark
        self._halt = threading.Event()
        self.flushes = 0  # round trips (one MULTI/EXEC each)
        self.events = 0  # engine events written: events/flushes = batching per round trip
        self.error: str | None = None  # a permanent write error: the worker reports unhealthy

    def put(self, run: JobRun, event: TokenEvent) -> None:
        """Called from the engine thread: never blocks."""
        self._queue.put((run, event))
        self._unmarked = True

    def step_done(self) -> None:
        """Called from the engine thread after each step: the events put so far form a whole step."""
        if self._unmarked:
            self._unmarked = False
            self._queue.put(STEP)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        while not (self._halt.is_set() and self._queue.empty()):
            batch = self._drain()
            if batch:
                self.write(batch)
            self._flush_metrics()
        self.effects.metrics.period_s = 0.0
        self._flush_metrics()  # what is left, before the worker exits

    def _flush_metrics(self) -> None:
        try:
            self.effects.flush_metrics()
        except redis.RedisError as exc:  # kept for the next try; metrics never fail a job
            log.warning("metrics write failed (%s); retrying later", exc)

    def _drain(self) -> list[tuple[JobRun, TokenEvent]]:
        """Whole engine steps (``_drain_steps``); while they hold only middle tokens (no job's first
        token, no end), more steps join them until ``stream_interval_s`` after the last write: one
        round trip and one stream wake for several steps, the first token and the end never held."""
        batch = self._drain_steps(0.05)
        while batch and len(batch) < MAX_BATCH_EVENTS and not self._urgent(batch):
            hold = self._last_flush + self.stream_interval_s - time.monotonic()
            if hold <= 0:
                break
            batch += self._drain_steps(hold)
        return batch

    @staticmethod
    def _urgent(batch: list[tuple[JobRun, TokenEvent]]) -> bool:
        """Written at once: a job's first events (its ``generating`` status, its TTFT) or its end."""
        return any(event.finished or not run.generating for run, event in batch)

    def _drain_steps(self, timeout: float) -> list[tuple[JobRun, TokenEvent]]:
        """Whole engine steps: everything queued, then (if the last step is still being emitted)
        its events up to its mark, waiting at most ``STEP_WAIT_S`` (events outside a step); the first
        event waited for up to ``timeout``."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return []
        batch: list[tuple[JobRun, TokenEvent]] = []
        deadline = time.monotonic() + STEP_WAIT_S
        while len(batch) < MAX_BATCH_EVENTS:
            if item is not STEP:
                batch.append(item)  # type: ignore[arg-type]
            elif self._queue.empty():
                break  # a whole step, and nothing of the next yet
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
        return batch

    def write(self, batch: list[tuple[JobRun, TokenEvent]]) -> None:
        """``flush`` then ``after_finish``, retrying connection errors; other errors fail the jobs."""
        try:
            done = self._retry(lambda: self.flush(batch))
            self.error = None  # a write went through: whatever failed before has passed
            if done:
                self._retry(lambda: self.effects.after_finish(done))
        except redis.RedisError as exc:
            log.exception("event write failed permanently; failing the affected jobs")
            self.error = f"event writer: {exc}"
            self._fail_runs({run.request_id: run for run, _ in batch}.values(), str(exc))
            return
        for item in done:
            self.on_finished(item.run)

    def _retry(self, write: Callable[[], T]) -> T:
        delay = 0.1
        while True:
            try:
                return write()
            except RETRYABLE as exc:  # Redis restarting: keep the events, try again
                log.warning("event write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _fail_runs(self, runs: Any, error: str) -> None:
        for run in runs:
            if run.released:
                continue
            run.released = True
            self.cancel(run.request_id)
            try:  # best effort: if this fails too, the entry stays pending and another worker claims it
                self.store.fail(run.job_id, f"internal error writing results: {error}", run.attempt)
                self.effects.ack(run)
            except redis.RedisError:
                log.warning("job %s: could not record the failure", run.job_id)
            self.on_finished(run)

    # --- one round of writes: build -> execute -> apply ---
    def flush(self, batch: list[tuple[JobRun, TokenEvent]]) -> list[Finished]:
        pipe = self.r.pipeline(transaction=True)
        parts = self._build(pipe, batch)
        results = pipe.execute()
        self._last_flush = time.monotonic()
        self.flushes += 1
        self.events += len(batch)
        return [f for part in parts if (f := self._apply(part, results)) is not None]

    def _build(self, pipe: Any, batch: list[tuple[JobRun, TokenEvent]]) -> list[_Part]:
        parts: dict[str, _Part] = {}
        for run, event in batch:
            if run.released:
                continue
            if (part := parts.get(run.request_id)) is None:
                starts = not (run.generating or event.finish_reason is FinishReason.REJECTED)  # never ran
                part = parts[run.request_id] = _Part(run, starts_generating=starts)
                if part.starts_generating:
                    self.store.set_status(run.job_id, JobStatus.GENERATING, run.attempt, client=pipe)
            self._tokens(part, event)
            if event.finished:
                self._queue_append(pipe, part)  # tokens before the end
                terminal, status = self._terminal(part, event)
                part.finish = (terminal, status, len(pipe.command_stack))
                self.store.finish(run.job_id, terminal, status, run.attempt, client=pipe)
                if status is JobStatus.DONE:
                    self.effects.with_finish(pipe, run, terminal.final_text or "")
        for part in parts.values():
            self._queue_append(pipe, part)
        return list(parts.values())

    def _queue_append(self, pipe: Any, part: _Part) -> None:
        if not part.events or part.append_at is not None:
            return
        part.append_at = len(pipe.command_stack)
        args: list[str | int] = [EVENTS_MAXLEN, part.run.attempt, *part.append_args()]
        pipe_script(pipe, APPEND_TOKENS_LUA, self.store.job_keys(part.run.job_id), args)

    def _tokens(self, part: _Part, event: TokenEvent) -> None:
        """Record the event's tokens in ``part``; queue its token event unless already published."""
        run, ids, start = part.run, list(event.token_ids), event.index
        if run.diverged or part.diverged or (not ids and not event.text) or start < part.recorded():
            return  # nothing new (a re-sent event is skipped: idempotent)
        overlap = run.published[start : start + len(ids)]
        if overlap != ids[: len(overlap)]:
            part.diverged = f"retry diverged from the tokens already streamed at index {start}"
            return
        part.ids.extend(ids)
        part.texts.append(event.text)
        part.first_token_at = part.first_token_at or time.time()
        if start + len(ids) <= len(run.published):
            return  # the client already has these
        part.publish(start, ids, event.text)

    def _apply(self, part: _Part, results: list[Any]) -> Finished | None:
        run = part.run
        run.generating = run.generating or part.starts_generating
        run.token_ids.extend(part.ids)
        run.texts.extend(part.texts)
        if part.ids:
            run.token_writes.append((time.time(), len(part.ids)))
        run.first_token_at = run.first_token_at or part.first_token_at
        refused = part.append_at is not None and not results[part.append_at]
        if part.diverged and not run.diverged:
            run.diverged = part.diverged
        if (part.diverged or refused) and not run.cancel_sent:  # terminal, or another attempt owns it
            run.cancel_sent = True
            self.cancel(run.request_id)
        if part.finish is None:
            return None
        event, status, index = part.finish
        return Finished(run, event, status, int(results[index]))

    def _terminal(self, part: _Part, event: TokenEvent) -> tuple[JobEvent, JobStatus]:
        """The terminal event for the engine's last event (the stream's done/error/status entry)."""
        run = part.run
        end = outcome(run.diverged or part.diverged, event)
        terminal = JobEvent(
            type=end.kind,
            status=end.status,
            finish_reason=end.finish_reason,
            error=end.error,
            error_code=end.error_code,
            attempt=run.attempt,
            final_text=run.text + "".join(part.texts),
            usage=usage_info(event),
            timings=self._timings(run, event, run.first_token_at or part.first_token_at),
        )
        return terminal, end.status

    def _timings(self, run: JobRun, event: TokenEvent, first_token_at: float | None) -> StageTimings:
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
            ttft=(first_token_at - created) if first_token_at else 0.0,
            total=now - created,
        )
