"""After a job's terminal state is written: result cache, metrics, then XACK (the conversation's
turn and the owner records go in the FINISH's own MULTI: ``with_finish``).

Runs on the writer thread, in one round trip per flush. Side effects happen only for the
attempt whose FINISH wrote the terminal state (reply 1, or 2 for a re-sent FINISH whose first
reply was lost); an entry is acknowledged unless another attempt owns the job (reply -1: that
attempt acknowledges it).

With ``VLMQ_REDIS_MIN_REPLICAS`` > 0 the side effects are followed by a WAIT, and the XACKs go out
in a second round trip only when enough replicas acknowledged: an entry is never acknowledged
for a terminal state that a failover could still take back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from services.inference_worker import job_metrics
from services.inference_worker.job_run import JobRun
from services.inference_worker.metrics_buffer import MetricsBuffer
from services.inference_worker.stream_consumer import StreamConsumer
from shared import conversations, log_context, metrics_hash, recent_jobs, result_cache
from shared.keys import Keys
from shared.schemas import JobEvent, JobSpec, JobStatus

log = logging.getLogger(__name__)
FENCED = -1


@dataclass(frozen=True)
class WriterConfig:
    model_id: str  # result_cache.model_identity(...): the weights that answer
    session_ttl_s: int
    result_cache_ttl_s: int
    shared_results: bool = False  # tenants hit each other's cached answers (VLMQ_RESULT_CACHE_SHARED)
    # queues the owner records of a finished job (``affinity.record_owner``), or nothing
    record_owner: Callable[[Any, JobSpec], None] = lambda _pipe, _spec: None
    owners_written: Callable[[], None] = lambda: None  # the MULTI with those records went through
    on_end: Callable[[Finished], None] = lambda _item: None  # each attempt's end (Flower's task events)
    min_replicas: int = 0  # WAIT for this many replicas before the XACK (0: no WAIT)
    wait_ms: int = 500
    stream_interval_s: float = 0.0  # longest a middle token is held for the next write


@dataclass(frozen=True)
class Finished:
    run: JobRun
    event: JobEvent
    status: JobStatus
    reply: int  # FINISH_LUA's reply: 1 written, 2 written before by this attempt, 0 terminal, -1 fenced

    @property
    def wrote(self) -> bool:
        return self.reply in (1, 2)


class FinishEffects:
    def __init__(self, client: Any, keys: Keys, consumer: StreamConsumer, config: WriterConfig) -> None:
        self.r = client
        self.keys = keys
        self.consumer = consumer
        self.config = config
        self.metrics = MetricsBuffer()  # done jobs' histograms: summed, written by ``flush_metrics``

    def flush_metrics(self) -> None:
        """Write the summed metrics if a period has passed (the writer calls it whenever it wakes)."""
        if self.metrics.due():
            self.metrics.flush(self.r)

    def after_finish(self, done: list[Finished]) -> None:
        """Called once the MULTI with the FINISHes (and the owner records) went through."""
        self.config.owners_written()
        pipe = self.r.pipeline(transaction=False)
        for item in done:
            if item.wrote:  # this attempt wrote the terminal state: its side effects happen once
                self._side_effects(pipe, item.run, item.event, item.status)
        if self.config.min_replicas > 0 and any(item.wrote for item in done):
            if not self._replicated(pipe):
                return self._report(done, " (not acknowledged yet: too few replicas)")
            pipe = self.r.pipeline(transaction=False)
        for item in done:
            if item.reply != FENCED:
                self.consumer.ack(pipe, item.run.entry)
        _execute(pipe)
        self._report(done)

    def _replicated(self, pipe: Any) -> bool:
        """Run the side effects, then WAIT on their connection: written after FINISH on the same
        master, they replicate after it, so a replica that has them has the terminal state. Too few
        replicas: no XACK now; the entry stays pending, and the worker that claims it after
        ``claim_idle_ms`` finds the job terminal and acknowledges it then."""
        wanted = self.config.min_replicas
        pipe.execute_command("WAIT", wanted, self.config.wait_ms)
        acked = _execute(pipe)[-1]
        if isinstance(acked, int) and acked >= wanted:
            return True
        log.warning(
            "terminal state acknowledged by %s of %d replicas: stream entries left pending", acked, wanted
        )
        return False

    def _report(self, done: list[Finished], suffix: str = "") -> None:
        """Log each attempt's end and tell the monitors (``on_end``)."""
        for item in done:
            self.config.on_end(item)
            note = {1: "", 2: " (re-sent)", 0: " (already terminal)", FENCED: " (another attempt owns it)"}
            with log_context.job(item.run.job_id):
                log.info(
                    "job %s attempt %d: %s%s (%d tokens)",
                    item.run.job_id,
                    item.run.attempt,
                    item.status.value,
                    note.get(item.reply, "") + suffix,
                    len(item.run.token_ids),
                )

    def ack(self, run: JobRun) -> None:
        pipe = self.r.pipeline(transaction=False)
        self.consumer.ack(pipe, run.entry)
        _execute(pipe)

    def with_finish(self, pipe: Any, run: JobRun, answer: str) -> None:
        """Queued in the MULTI of a ``done`` FINISH, after it: the conversation's new turn (only if
        this attempt's FINISH wrote the job) and the owner records. A client that sees the job
        done then finds both, so its next turn is built on this one and routed to this worker."""
        conversations.record_turn(pipe, self.keys, run.spec, answer, self.config.session_ttl_s, run.attempt)
        self.config.record_owner(pipe, run.spec)

    def _side_effects(self, pipe: Any, run: JobRun, event: JobEvent, status: JobStatus) -> None:
        key = self.keys.metrics_counters()
        metrics_hash.inc(pipe, key, "jobs_total", outcome=status.value)
        if status is not JobStatus.DONE:
            return
        recent_jobs.record(pipe, self.keys, event.timings, event.usage)
        cache_key = result_cache.cache_key(
            self.keys, self.config.model_id, run.spec, self.config.shared_results
        )
        if cache_key and event.usage is not None:
            record = result_cache.CachedResult(
                text=run.text, usage=event.usage, finish_reason=event.finish_reason or "stop"
            )
            pipe.set(cache_key, result_cache.encode(record), ex=self.config.result_cache_ttl_s)
        job_metrics.record_done(self.metrics, key, run, event)  # summed, written once a second


def _execute(pipe: Any) -> list[Any]:
    """Run the side effects; one refused command (an XACK of a stream that vanished: NOGROUP) must
    not undo or block the others, so errors are logged, not raised. Connection errors still raise."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            log.warning("a side effect after a job's end was refused: %s", reply)
    return replies
