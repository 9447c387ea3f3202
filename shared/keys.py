"""Every Redis key vlmq uses, built in one place.

All keys share the ``vlmq:`` prefix (overridable per deployment/test via ``VLMQ_KEY_PREFIX``)
so a test run can use its own namespace and `make up` never collides with it.
"""

from __future__ import annotations

from dataclasses import dataclass

INFERENCE_GROUP = "inference"
PIXELS_SUFFIX = ":pixels"  # job hash key + this = the job's pixels (FINISH_LUA derives it the same way)
INTERACTIVE_SUFFIX = ":interactive"  # active-jobs set + this = its interactive part (FINISH_LUA too)


@dataclass(frozen=True)
class Keys:
    prefix: str = "vlmq"

    # --- images and tensors (content-addressed, TTL) ---
    def image(self, digest: str) -> str:
        return f"{self.prefix}:img:{digest}"

    def tensor(self, digest: str, processor_id: str) -> str:
        """The previous release's decoded tensor of an image (float16, TTL): read only as a fallback
        while its decode workers still run (a rolling upgrade); today's are ``job_pixels``."""
        return f"{self.prefix}:tensor:{processor_id}:{digest}"

    # --- jobs ---
    def job(self, job_id: str) -> str:
        """Hash: the job record (spec, status, result, timings)."""
        return f"{self.prefix}:job:{job_id}"

    def job_events(self, job_id: str) -> str:
        """Stream: the job's events (status, token, done, error); entry ids are the event ids."""
        return f"{self.prefix}:job:{job_id}:events"

    def job_wake(self, job_id: str) -> str:
        """Pub/sub channel: wakes listeners of a job's event stream; carries no data of its own."""
        return f"{self.prefix}:job:{job_id}:wake"

    def job_pixels(self, job_id: str) -> str:
        """String: the job's decoded image (``shared.tensors.pack_image``), written with the
        hand-over to inference and deleted by FINISH_LUA when the job turns terminal."""
        return f"{self.job(job_id)}{PIXELS_SUFFIX}"

    def job_cancel(self, job_id: str) -> str:
        """String flag set when a client cancels; read by workers before and during the run."""
        return f"{self.prefix}:job:{job_id}:cancel"

    # --- queues ---
    def inference_stream(self) -> str:
        """Stream read by inference workers through the consumer group ``INFERENCE_GROUP``."""
        return f"{self.prefix}:inference"

    def batch_stream(self) -> str:
        """Stream of batch-priority jobs: read with what interactive work leaves (same group)."""
        return f"{self.prefix}:inference:batch"

    def worker_stream(self, worker_id: str) -> str:
        """Stream of the jobs routed to one inference worker for its caches (same group name)."""
        return f"{self.prefix}:inference:w:{worker_id}"

    def session_owner(self, affinity_key: str) -> str:
        """String: the inference worker whose engine holds this affinity key's session KV (TTL)."""
        return f"{self.prefix}:owner:session:{affinity_key}"

    def image_owner(self, digest: str) -> str:
        """String: the inference worker whose image cache holds this image's features (TTL)."""
        return f"{self.prefix}:owner:image:{digest}"

    def image_input_owner(self, scope: str, digest: str) -> str:
        """String: the inference worker that holds this image decoded (its ``ImageInputCache``), for
        the jobs of ``scope`` (a tenant, or "" for all: ``shared.jobs.routing.holder_scope``; TTL)."""
        return f"{self.prefix}:owner:input:{scope}:{digest}"

    def active_jobs(self) -> str:
        """Sorted set: every accepted job not yet terminal (member: its ``job`` key), scored by the
        time of its last progress. Its size is the admission depth; the sweeper reads its old end."""
        return f"{self.prefix}:jobs:active"

    def interactive_jobs(self) -> str:
        """Sorted set: accepted interactive jobs not yet terminal (member: its ``job`` key), scored by
        when it stops holding batch work (admission + ``batch_hold_s``). While a live entry is in
        it, inference workers hold their batch-priority work (``Engine.hold_batch``)."""
        return self.active_jobs() + INTERACTIVE_SUFFIX

    def sweeper_lock(self) -> str:
        """String held by the one inference worker sweeping stuck jobs right now (NX, short TTL)."""
        return f"{self.prefix}:sweeper"

    def dead_letters(self) -> str:
        """Stream of jobs that exceeded the delivery cap."""
        return f"{self.prefix}:dead"

    def celery_prefix(self) -> str:
        """Prefix of Celery's own keys (broker ``global_keyprefix``)."""
        return f"{self.prefix}:celery:"

    def decode_queue(self, queue: str = "decode") -> str:
        """List holding waiting ``vlmq.decode`` tasks of a Celery queue (``decode``, or
        ``decode.batch`` for batch priority): LLEN = its depth."""
        return f"{self.celery_prefix()}{queue}"

    def decode_claim(self, task_id: str) -> str:
        """String: the queue message a running decode task took beside its own (``worker.claims``),
        kept until its job is done so that a redelivered task can put it back; a list while the
        task waits for the next job (armed: one empty marker; then what its ``BLMOVE`` moved)."""
        return f"{self.prefix}:decode:claim:{task_id}"

    # --- conversations and results ---
    def conversation(self, conversation_id: str, tenant: str | None = None) -> str:
        """Hash: a stored conversation (messages JSON, image digest); the API calls its id session_id.
        A tenant's ids are its own (two tenants' ``s-1`` are two conversations). Without tenants
        the key keeps the previous release's name, so both serve it during a rolling upgrade."""
        if tenant is None:
            return f"{self.prefix}:session:{conversation_id}"
        return f"{self.prefix}:session:{tenant}/{conversation_id}"

    def tenant_jobs(self, tenant: str) -> str:
        """Sorted set: the tenant's jobs in flight (its concurrency quota)."""
        return f"{self.prefix}:tenant:{tenant}:jobs"

    def tenant_window(self, tenant: str, what: str, minute: int) -> str:
        """Counter: the tenant's requests or tokens in one minute (its rate quotas)."""
        return f"{self.prefix}:tenant:{tenant}:{what}:{minute}"

    def result_cache(self, request_hash: str) -> str:
        return f"{self.prefix}:result:{request_hash}"

    # --- OpenAI batch API ---
    def file(self, file_id: str) -> str:
        """Hash: an uploaded or produced file's record (tenant, purpose, name, size, lines)."""
        return f"{self.prefix}:file:{file_id}"

    def file_lines(self, file_id: str) -> str:
        """List: the file's JSONL lines (a batch reads its input one line at a time)."""
        return f"{self.prefix}:file:{file_id}:lines"

    def tenant_files(self, tenant: str | None) -> str:
        return f"{self.prefix}:files:{tenant or '-'}"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch (its request, status, counts, submission cursor, result files)."""
        return f"{self.prefix}:batch:{batch_id}"

    def batch_inflight(self, batch_id: str) -> str:
        """Hash: input line number -> job id, for the batch's jobs not collected yet."""
        return f"{self.prefix}:batch:{batch_id}:inflight"

    def batch_results(self, batch_id: str, kind: str) -> str:
        """List: the output (``out``) or error (``err``) lines collected so far."""
        return f"{self.prefix}:batch:{batch_id}:{kind}"

    def active_batches(self) -> str:
        """Set: batches the driver still works on."""
        return f"{self.prefix}:batches:active"

    def tenant_batches(self, tenant: str | None) -> str:
        return f"{self.prefix}:batches:{tenant or '-'}"

    def batch_driver_lock(self) -> str:
        """String held by the one gateway driving batches right now (NX, short TTL)."""
        return f"{self.prefix}:batches:driver"

    # --- workers ---
    def worker_heartbeat(self, worker_id: str) -> str:
        """String (JSON stats) with a short TTL; its presence means the worker is alive."""
        return f"{self.prefix}:worker:{worker_id}"

    def workers(self) -> str:
        """Sorted set of inference worker ids scored by their last heartbeat (readers never SCAN)."""
        return f"{self.prefix}:workers"

    def recent_jobs(self) -> str:
        """List (capped): latencies of the latest finished jobs, newest first (``shared.recent_jobs``)."""
        return f"{self.prefix}:recent"

    def metrics_counters(self) -> str:
        """Hash of counters published by workers (jobs by outcome, stage time sums...)."""
        return f"{self.prefix}:metrics"
