"""The inference worker's main loop: read the stream, submit to the engine, poll cancels, heartbeat.

Everything here runs on the main thread; the engine decodes on its own thread and the
``EventWriter`` thread writes its events. ``InferenceWorker.run()`` returns after a SIGTERM once
in-flight jobs have finished (or ``drain_timeout_s`` passed: the rest are released to the
group, status back to ``waiting``, for another worker to claim). Entries are renewed every
heartbeat, during the drain too; an entry another worker claimed meanwhile is dropped here (its
attempt is fenced: it can no longer write the job).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import redis

from services.engine.api import GenerationRequest, RequestRejected
from services.inference_worker import job_spans
from services.inference_worker.affinity import Rebalancer, record_owner
from services.inference_worker.after_finish import Finished, WriterConfig
from services.inference_worker.batch_hold import BatchHold
from services.inference_worker.engine_request import build_request, prepare_pictures
from services.inference_worker.event_writer import EventWriter
from services.inference_worker.image_inputs import ImageInputCache, PixelsNeeded
from services.inference_worker.input_owners import InputOwners
from services.inference_worker.job_images import job_images
from services.inference_worker.job_run import JobRun
from services.inference_worker.job_store import Begun, JobStore, begun
from services.inference_worker.stream_consumer import Entry, StreamConsumer
from services.inference_worker.sweeper import Sweeper
from services.inference_worker.task_events import TaskEvents
from services.vlm.image_processor import ImageProcessorHandle
from shared import log_context, metrics_hash, workers
from shared.config import InferenceSettings
from shared.decode_task import DecodeTasks
from shared.jobs import JobRecord, refusal
from shared.jobs.routing import DECODE_SKIPPED
from shared.schemas import ErrorCode, JobSpec, JobStatus
from shared.tensors import TensorCodecError

log = logging.getLogger(__name__)
CANCEL_POLL_S = 0.05
Ready = tuple[JobRun, GenerationRequest]  # a registered run and its request, not yet submitted
READ_BLOCK_MS = 50


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class InferenceWorker:
    def __init__(
        self, settings: InferenceSettings, engine: Any, client: redis.Redis, pixels: ImageProcessorHandle
    ):
        self.settings = settings
        self.engine = engine
        self.r: Any = client  # redis-py's return types are unions; the shapes are known here
        self.keys = settings.keys
        self.pixels = pixels  # the engine's image processor: finishes the decode workers' pixels
        # turns without pixels
        self.image_inputs = ImageInputCache(int(settings.image_input_cache_mb * 2**20))
        self.worker_id = settings.worker_id or default_worker_id()
        self.input_owners = InputOwners(
            self.keys, self.worker_id, self.image_inputs, settings.result_cache_shared, settings.image_ttl_s
        )
        self.task_events = TaskEvents(settings, self.worker_id)  # Flower sees the inference stage
        max_batch = settings.max_batch or int(engine.stats().to_dict().get("max_batch") or 8)
        self.capacity = 2 * max_batch  # a waiting queue lets the engine fill its batch
        self.interactive_reserve = max_batch  # slots batch-priority work never takes
        self.store = JobStore(client, self.keys, settings.job_ttl_s, settings.image_ttl_s)
        self.consumer = StreamConsumer(client, self.keys, self.worker_id)
        config = WriterConfig(
            settings.result_model_id,
            settings.session_ttl_s,
            settings.result_cache_ttl_s,
            settings.result_cache_shared,
            self._record_owners,
            owners_written=self.input_owners.written,
            min_replicas=settings.redis_min_replicas,
            wait_ms=settings.redis_wait_ms,
            on_end=self._ended,
            stream_interval_s=settings.stream_interval_ms / 1000,
        )
        self.writer = EventWriter(client, self.store, self.consumer, config, self._finished, engine.cancel)
        engine.add_step_listener(self.writer.step_done)  # one write per engine step
        self.runs: dict[str, JobRun] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._slot_freed = threading.Event()  # set when a run ends: the reader may take a new entry
        self.decode_tasks = DecodeTasks(settings)  # the sweeper's re-enqueues, returns to decoding
        self.sweeper = Sweeper(client, settings, self.worker_id, self.store, self.decode_tasks)
        self.rebalancer = Rebalancer(client, settings, self.worker_id)
        linger = settings.batch_hold_linger_s
        self.batch_hold = BatchHold(client, self.keys, engine, linger) if settings.batch_hold_s > 0 else None
        self._next = {"heartbeat": 0.0, "cancel": 0.0, "claim": 0.0, "sweep": 0.0, "rebalance": 0.0}

    # --- lifecycle ---
    def run(self) -> None:
        self.consumer.ensure_groups()
        self.consumer.prune_consumers()
        self.writer.start()
        self.task_events.start()
        if self.batch_hold is not None:
            self.batch_hold.start()
        self.heartbeat()
        self.handle_many(self.consumer.read(self.capacity, 0, own_pending=True))  # same name, restarted
        log.info("inference worker %s reading %s", self.worker_id, self.keys.inference_stream())
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                self.tick()
                backoff = 0.1
            except redis.RedisError as exc:  # down, restarting, or the stream/group vanished
                backoff = self._recover(exc, backoff)
        self.shutdown()

    def _recover(self, exc: redis.RedisError, backoff: float) -> float:
        """After a Redis error: recreate the stream's group if it vanished (DEL, FLUSHDB, eviction, a
        restart without persistence), wait a little, carry on. Running jobs keep running; the
        sweeper re-enqueues jobs whose entries were lost. Returns the next wait."""
        log.warning(
            "redis error in the reader loop (%s: %s); retrying in %.1fs", type(exc).__name__, exc, backoff
        )
        time.sleep(backoff)
        if isinstance(exc, redis.ResponseError):
            try:
                self.consumer.ensure_groups()
            except redis.RedisError as again:
                log.warning("could not recreate the consumer group yet: %s", again)
        return min(2 * backoff, 2.0)

    def tick(self) -> None:
        if not self.engine.healthy:  # it runs nothing more: release the jobs and exit to be restarted
            log.error("engine unhealthy (%s): releasing in-flight jobs and exiting", self.engine.last_error)
            self.settings.drain_timeout_s = 0.0  # nothing in flight can finish here
            self.stopping.set()
            return
        now = time.monotonic()
        if now >= self._next["heartbeat"]:
            self._next["heartbeat"] = now + self.settings.heartbeat_s
            self.heartbeat()
            self.renew()
        if now >= self._next["cancel"]:
            self._next["cancel"] = now + CANCEL_POLL_S
            self.poll_cancels()
        if now >= self._next["claim"]:
            self._next["claim"] = now + max(0.5, self.settings.claim_idle_ms / 2000)
            streams = self.rebalancer.claim_streams()
            idle = self.consumer.claim_idle(self.settings.claim_idle_ms, self.free_slots(), streams)
            self.handle_many(idle)
        if now >= self._next["rebalance"] and self.settings.affinity_routing:
            self._next["rebalance"] = now + self.rebalancer.period_s
            self.rebalancer.rebalance()
        if now >= self._next["sweep"]:
            self._next["sweep"] = now + self.sweeper.period_s
            self.sweeper.sweep()
        free = self.free_slots()
        if free <= 0:  # full: wait for a job to finish (not a fixed sleep), then read at once
            self._slot_freed.wait(READ_BLOCK_MS / 1000)
            self._slot_freed.clear()
            return
        # Interactive work starts before the batch stream is read: that read is a round trip its
        # wait would otherwise include. Batch work then takes what is left, minus a batch's worth
        # kept for interactive arrivals.
        self.handle_many(self.consumer.read(free, READ_BLOCK_MS))
        self.handle_many(self.consumer.read_batch(self.free_slots() - self.interactive_reserve))

    def shutdown(self) -> None:
        if self.batch_hold is not None:  # in-flight batch work must be able to finish now
            self.batch_hold.stop()
        started = time.monotonic()
        while self._runs() and time.monotonic() < started + self.settings.drain_timeout_s:  # 2nd signal: 0
            self.poll_cancels()
            if time.monotonic() >= self._next["heartbeat"]:
                self._next["heartbeat"] = time.monotonic() + self.settings.heartbeat_s
                self.heartbeat()
                self.renew()
            time.sleep(CANCEL_POLL_S)
        leftover = self._runs()
        for run in leftover:  # another worker claims them; never left "generating" here
            run.released = True
        self.engine.stop(drain_timeout_s=0.0)
        self.writer.stop()
        for run in leftover:
            self.store.set_status(run.job_id, JobStatus.WAITING, run.attempt)
        pipe = self.r.pipeline(transaction=False)
        workers.withdraw(pipe, self.keys, self.worker_id)
        pipe.execute()
        self.task_events.stop()
        log.info("inference worker %s stopped (%d jobs released)", self.worker_id, len(leftover))

    # --- stream entries ---
    def handle(self, entry: Entry) -> None:
        self.handle_many([entry])

    def handle_many(self, entries: list[Entry]) -> None:
        """Start the entries read together: their attempts begun in one round trip, their requests
        handed to the engine at once (an idle engine prefills them in one step). A Redis error
        leaves the entries pending: retried by this worker's loop or claimed by another."""
        fresh: list[Entry] = []
        for entry in entries:
            if not entry.job_id:
                self._ack(entry)  # a deleted entry
            elif entry.job_id not in self._run_ids() and entry not in fresh:  # not ours already
                fresh.append(entry)
        replies = self.store.begin_many([entry.job_id for entry in fresh])
        ready = []
        for entry, reply in zip(fresh, replies, strict=True):
            with log_context.job(entry.job_id):  # its log lines name the job
                ready.append(self._guarded(entry, reply))
        self._submit_all([r for r in ready if r is not None])

    def _guarded(self, entry: Entry, reply: Any) -> Ready | None:
        try:
            return self._prepare(entry, begun(reply))
        except redis.RedisError:
            raise
        except Exception as exc:  # a malformed job must not crash the worker (nor loop forever)
            self._broken(entry, exc)
            return None

    def _broken(self, entry: Entry, exc: Exception) -> None:
        log.exception("job %s: cannot start", entry.job_id, exc_info=exc)
        self._forget(entry.job_id)
        self.store.fail(entry.job_id, f"internal error starting the job: {exc}", 0, fenced=False)
        self._ack(entry, outcome=JobStatus.FAILED)

    def _prepare(self, entry: Entry, begun: Begun | None) -> Ready | None:
        """The run and request of a begun attempt, registered; None when it ends here instead."""
        if begun is None or begun.record.status.terminal:
            self._ack(entry)  # gone, or finished by an earlier delivery
            return None
        record, attempt = begun.record, begun.attempt
        delivered = attempt - int(begun.fields.get("returned", 0))  # a return to decoding ran nothing
        if delivered > self.settings.max_deliveries:
            why = f"delivered {delivered - 1} times without finishing"
            self.store.dead_letter(entry.job_id, "inference", delivered - 1, why, fence=attempt)
            self._ack(entry, outcome=JobStatus.FAILED)
            return None
        if reason := self._refusal(record, attempt, begun.cancelled):
            self._ack(entry, outcome=reason)
            return None
        try:
            return self._register(entry, record, begun.fields, attempt, begun.pixels)
        except PixelsNeeded:
            self._return_to_decoding(entry, attempt, record.spec)
            return None
        except (RequestRejected, LookupError, TensorCodecError) as exc:
            self._reject(entry, attempt, exc)
            return None

    def _return_to_decoding(self, entry: Entry, attempt: int, spec: JobSpec) -> None:
        """A turn handed over without pixels whose images are not held here (evicted, restarted,
        claimed from another worker): its decode task again and its entry acknowledged, in one script.
        The decode worker hands it back with pixels. The records that sent it here go too."""
        message = self.decode_tasks.message(entry.job_id)
        returned = self.store.return_to_decoding(entry.job_id, attempt, message, entry.stream, entry.entry_id)
        if returned == 1:
            self.image_inputs.returned += 1
            log.info("job %s: its images are not held here; back to decoding", entry.job_id)
            self._forget_unheld(spec)
        elif returned == -1:
            log.warning(
                "job %s: attempt %d fenced out; its entry is another attempt's", entry.job_id, attempt
            )

    def _forget_unheld(self, spec: JobSpec) -> None:
        """Best effort: a record left behind costs the next such job one more return, no more."""
        try:
            pipe = self.r.pipeline(transaction=False)
            self.input_owners.forget_unheld(pipe, spec)
            pipe.execute()
        except redis.RedisError:
            log.warning("job %s: its pictures' owner records not deleted", spec.job_id, exc_info=True)

    def _reject(self, entry: Entry, attempt: int, exc: Exception) -> None:
        self._forget(entry.job_id)
        self.store.fail(entry.job_id, str(exc), attempt, _error_code(exc))
        self._ack(entry, outcome=JobStatus.FAILED)

    def _submit_all(self, ready: list[Ready]) -> None:
        """One hand-over to the engine; it validates each request (refused ones fail their job)."""
        if not ready:
            return
        # An idle engine renders the prompts while this thread finishes the pictures; a busy one
        # would take them at its next step and, got there first, finish them on its own thread.
        overlap = self.engine.idle()
        if not overlap:
            ready = self._finished_first(ready)
            if not ready:
                return
        items = [(request, lambda event, run=run: self.writer.put(run, event)) for run, request in ready]
        try:
            refused = self.engine.submit_many(items)
        except Exception as exc:  # an engine bug: the jobs must still end
            for run, _ in ready:
                self._broken(run.entry, exc)
            return
        if overlap:  # a picture that cannot be finished fails its request in the engine, alone
            prepare_pictures(request for _, request in ready)
        for (run, _), why in zip(ready, refused, strict=True):
            if why is not None:
                self._reject(run.entry, run.attempt, why)
            else:
                self.task_events.job_started(run.spec.job_id, run.attempt)

    def _finished_first(self, ready: list[Ready]) -> list[Ready]:
        """The jobs whose pictures are finished; one with a picture that cannot be is rejected."""
        kept = []
        for (run, request), why in zip(ready, prepare_pictures(r for _, r in ready), strict=True):
            if why is None:
                kept.append((run, request))
            else:
                self._reject(run.entry, run.attempt, why)
        return kept

    def _refusal(self, record: JobRecord, attempt: int, cancelled: bool) -> JobStatus | None:
        """Cancelled or expired before it ran: finish it now, never generate."""
        refused = refusal(record.spec, cancelled, before="generation")
        if refused is None:
            return None
        self.store.end(record.spec.job_id, refused.status, refused.code, refused.error, attempt)
        return refused.status

    def _register(
        self, entry: Entry, record: JobRecord, fields: dict[str, str], attempt: int, pixels: bytes | None
    ) -> Ready:
        """The attempt's request and run; the run is registered (submitted by ``_submit_all``)."""
        spec = record.spec
        images = job_images(
            self.image_inputs, self.store, self.pixels, record.spec, pixels, DECODE_SKIPPED in fields
        )
        request = build_request(spec, f"{spec.job_id}:{attempt}", images)
        run = JobRun(
            entry=entry,
            spec=spec,
            attempt=attempt,
            request_id=request.request_id,
            published=self.store.published_tokens(spec.job_id) if attempt > 1 else [],
            queue_s=_seconds_between(spec.created_at, fields.get("decode_started_at")),
            decode_s=float(fields.get("decode_s", 0.0)),
            waiting_at=float(fields["waiting_at"]) if "waiting_at" in fields else None,
        )
        with self._lock:
            self.runs[spec.job_id] = run
        return run, request

    # --- running jobs ---
    def poll_cancels(self) -> None:
        runs = {run.job_id: run for run in self._runs() if not run.cancel_sent}
        for job_id in self.store.cancel_requested(list(runs)):
            runs[job_id].cancel_sent = True
            self.engine.cancel(runs[job_id].request_id)

    def renew(self) -> None:
        """Keep this worker's entries from going idle; drop the runs of entries it no longer owns."""
        runs = self._runs()
        lost = self.consumer.renew([run.entry for run in runs])
        for run in runs:
            if run.entry.entry_id in lost:
                log.warning("job %s: claimed by another worker; dropping attempt %d", run.job_id, run.attempt)
                run.released = True
                self.engine.cancel(run.request_id)
                self._forget(run.job_id)

    @property
    def healthy(self) -> bool:
        return bool(self.engine.healthy) and self.writer.error is None

    def free_slots(self) -> int:
        if self.stopping.is_set() or not self.healthy:
            return 0
        return self.capacity - len(self._run_ids())

    def heartbeat(self) -> None:
        beat = {
            "worker_id": self.worker_id,
            "model": self.settings.model,
            "quantize": self.settings.quantize,
            "device": self.engine.config.device,  # resolved: "auto" names no device
            "healthy": self.healthy,
            "last_error": self.writer.error or self.engine.last_error,
            "ts": time.time(),
            "inflight": len(self._run_ids()),
            "capacity": self.capacity,
            "stopping": self.stopping.is_set(),
            "writer": {"events": self.writer.events, "flushes": self.writer.flushes},
            "engine": self.engine.stats().to_dict(),
        }
        if self.image_inputs.max_bytes > 0:  # its presence: this worker takes jobs without pixels
            beat["image_inputs"] = self.image_inputs.stats()
        ttl_ms = int(1000 * self.settings.worker_stale_s)  # the gateway's staleness rule, same setting
        pipe = self.r.pipeline(transaction=False)
        workers.publish(pipe, self.keys, beat, ttl_ms)
        pipe.execute()
        self.task_events.heartbeat(beat["inflight"])

    def _record_owners(self, pipe: Any, spec: JobSpec) -> None:
        """Writer thread, in a done job's FINISH MULTI: who holds its session KV, image features and
        decoded pictures now (the gateway's and the decode workers' routing reads them)."""
        record_owner(pipe, self.keys, spec, self.worker_id, self.settings)
        self.input_owners.record(pipe, spec)

    def _ended(self, item: Finished) -> None:
        """Writer thread: an attempt ended; tell Flower and the tracer (both off by default)."""
        try:
            self.task_events.job_ended(item)
            job_spans.record(item, self.worker_id)
        except Exception:  # monitoring never fails the writer (nor so the worker)
            log.exception("job %s: task event or spans not recorded", item.run.job_id)

    def _finished(self, run: JobRun) -> None:
        """Writer thread: the job's terminal state is written and its entry acknowledged."""
        self._forget(run.job_id)

    # --- helpers ---
    def _ack(self, entry: Entry, outcome: JobStatus | None = None) -> None:
        pipe = self.r.pipeline(transaction=False)
        self.consumer.ack(pipe, entry)
        if outcome is not None:
            metrics_hash.inc(pipe, self.keys.metrics_counters(), "jobs_total", outcome=outcome.value)
        pipe.execute()

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self.runs.pop(job_id, None)
        self._slot_freed.set()

    def _runs(self) -> list[JobRun]:
        with self._lock:
            return list(self.runs.values())

    def _run_ids(self) -> set[str]:
        with self._lock:
            return set(self.runs)


def _error_code(exc: Exception) -> ErrorCode:
    if isinstance(exc, RequestRejected):
        return ErrorCode.INVALID_REQUEST
    if isinstance(exc, LookupError):
        return ErrorCode.IMAGE_EXPIRED
    return ErrorCode.INTERNAL  # a stored tensor we cannot read


def _seconds_between(start: float, end: str | None) -> float:
    return max(0.0, float(end) - start) if end else 0.0
