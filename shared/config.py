"""Settings, one pydantic-settings class per process family, all read from ``VLMQ_*``.

Every field is listed with its default in ``.env.example``. Each process reads its class
once at start-up (``get_*_settings()``), so a test can set environment variables before
starting a process and get a fully isolated configuration.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.keys import Keys
from shared.redis_clients import SentinelOptions
from shared.result_cache import model_identity

KNOWN_DEFAULTS = frozenset({"vlmq-dev-only", "changeme", "change-me", "secret", "password"})


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VLMQ_", env_file=".env", extra="ignore")

    env: Literal["development", "production"] = Field(
        "development",
        description="production refuses missing or known-default secrets (compose and k8s run production)",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis for jobs, images, streams, Celery; or its sentinels: "
        "sentinel://[:password@]h1:26379[/db];sentinel://h2:26379",
    )
    redis_sentinel_master: str = Field(
        "mymaster", description="Master name the sentinels monitor (only with a sentinel:// URL)"
    )
    redis_sentinel_password: str | None = Field(
        None,
        description="Password of the sentinels themselves, if they require one (the URL's password is "
        "the Redis servers')",
    )
    redis_min_replicas: int = Field(
        0,
        ge=0,
        description="Replicas that must acknowledge a job (WAIT) before the gateway answers 202 and before "
        "the inference worker acknowledges its stream entry; 0: asynchronous replication only",
    )
    redis_wait_ms: int = Field(
        500,
        ge=1,
        le=5000,
        description="How long a WAIT for VLMQ_REDIS_MIN_REPLICAS replicas may take; fewer: the gateway "
        "answers 503",
    )
    key_prefix: str = Field("vlmq", description="Prefix of every Redis key (tests use their own)")
    model: str = Field("models/vlmq-tiny", description="Local path of the served Hugging Face checkpoint")
    model_name: str = Field("vlmq-tiny", description="Model id reported by /v1/models and responses")
    job_ttl_s: int = Field(3600, description="How long job records and event streams are kept")
    gc_freeze: bool = Field(
        True,
        description="Once ready, a process moves its startup objects out of Python's garbage collector's "
        "reach (gc.freeze): a full collection walked all of them (~425k in the workers, ~94k in the "
        "gateway), ~190 ms with the GIL held in the inference worker; false: Python's default",
    )
    batch_hold_s: float = Field(
        2.0,
        ge=0.0,
        description="While an interactive job is in flight (accepted, not finished; at most this long "
        "per job), inference workers hold batch-priority work: it runs on what interactive work leaves "
        "idle, and ages in after VLMQ_PRIORITY_AGING_S. 0: batch work shares the engine with "
        "interactive work except while an interactive sequence runs in the same engine",
    )
    image_ttl_s: int = Field(
        900, description="How long uploaded image bytes are kept after last use (later turns decode them)"
    )
    session_ttl_s: int = Field(1800, description="How long a stored conversation is kept after its last turn")
    max_image_bytes: int = Field(10 * 1024 * 1024, description="Largest accepted upload")
    max_image_pixels: int = Field(
        40_000_000, description="Largest decoded image (width*height); bombs refused"
    )
    max_prompt_chars: int = Field(8000, description="Longest accepted prompt text")
    default_max_tokens: int = Field(64, description="max_tokens when a request does not say")
    max_tokens_limit: int = Field(512, description="Largest accepted max_tokens")
    log_level: str = Field("INFO", description="Python log level of every process")
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry collector's OTLP/HTTP base URL (e.g. http://collector:4318): every "
        "process exports its spans to <url>/v1/traces; unset: no tracing",
    )
    quantize: str = Field(
        "none", description="none|bf16|int8|int4, applied at load time (part of the result-cache key)"
    )
    worker_stale_s: float = Field(
        10.0, description="Heartbeat TTL of inference workers; /readyz counts an older heartbeat as gone"
    )
    max_job_s: float = Field(
        1800.0,
        description="Upper bound on every job's life (timeout_s is capped by it); must be below job_ttl_s",
    )
    stuck_after_s: float = Field(
        30.0,
        description="A job queued/decoding/waiting this long without progress is re-enqueued by the sweeper",
    )
    result_cache_shared: bool = Field(
        False,
        description="Let tenants share result-cache hits and decoded pictures (off: a tenant only hits its "
        "own answers, and only a picture it sent before skips decoding)",
    )
    affinity_routing: bool = Field(
        True,
        description="Route a job to the live inference worker that holds its session KV or image features",
    )
    max_decode_attempts: int = Field(
        3, description="Decode deliveries (worker deaths, sweeper re-enqueues) after which a job fails"
    )

    @model_validator(mode="after")
    def _production_secrets(self) -> Self:
        password = urlsplit(self.redis_url.split(";")[0]).password
        if self.env == "production" and (not password or password in KNOWN_DEFAULTS):
            raise ValueError(
                "VLMQ_ENV=production needs a Redis password of your own in VLMQ_REDIS_URL "
                "(missing or a known default)"
            )
        return self

    @model_validator(mode="after")
    def _job_ends_before_its_record(self) -> Self:
        if self.max_job_s >= self.job_ttl_s:
            raise ValueError(
                f"max_job_s ({self.max_job_s}) must be below job_ttl_s ({self.job_ttl_s}): "
                "a job's record must outlive the job"
            )
        return self

    @property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    @property
    def sentinel(self) -> SentinelOptions:
        """How to find the master when ``redis_url`` names sentinels."""
        return SentinelOptions(self.redis_sentinel_master, self.redis_sentinel_password)

    @property
    def result_model_id(self) -> str:
        """The weights that answer (path, checkpoint fingerprint, quantize): the result-cache key's model."""
        return model_identity(self.model, self.quantize)


class GatewaySettings(CommonSettings):
    host: str = Field("127.0.0.1", description="Gateway bind address")
    port: int = Field(8000, description="Gateway port")
    reuse_decoded_images: bool = Field(
        True,
        description="Hand a job whose images a live inference worker holds decoded (a follow-up, or a "
        "picture the same tenant sent before) straight to that worker: no decode task (it sends the job "
        "back on a miss)",
    )
    result_cache_ttl_s: int = Field(
        3600, description="Greedy result cache lifetime (and Cache-Control max-age)"
    )
    max_queue_depth: int = Field(
        256, description="Admission: jobs waiting for decode + inference above which submissions get 429"
    )
    stream_connections: int = Field(
        400,
        description="Redis connections for SSE/WebSocket readers (own pool); full: 503 for new streams",
    )
    max_conversation_chars: int = Field(
        32_000,
        description="Largest OpenAI conversation (text of all messages, in characters); larger: 413 before "
        "anything is stored or tokenized",
    )
    max_turns: int = Field(64, description="Most messages in one OpenAI conversation; more: 413")
    max_images_per_request: int = Field(
        4,
        ge=1,
        le=16,
        description="Most images one job may show (an OpenAI request's image parts; a stored conversation's "
        "images, new ones included); more: 400",
    )
    max_batch_file_bytes: int = Field(
        100 * 1024 * 1024, description="Largest OpenAI batch input file (JSONL, images as data URLs)"
    )
    batch_inflight: int = Field(
        32, description="Jobs one batch keeps in flight at once (the rest wait in its input file)"
    )
    batch_file_ttl_s: int = Field(
        7 * 24 * 3600, description="How long batch input and output files and batch records are kept"
    )
    api_keys: str | None = Field(
        None, description="Comma-separated API keys, each its own tenant (none and no keys file: open)"
    )
    api_keys_file: str | None = Field(
        None,
        description="Keys file, one per line: KEY [tenant=NAME] [rpm=N] [tpm=N] [concurrency=N] "
        "[priority=interactive|batch] [admin]; re-read when it changes or on SIGHUP",
    )
    metrics_port: int | None = Field(
        None, description="A second listener serving only /metrics, without a key (for Prometheus)"
    )
    allowed_hosts: str = Field(
        "localhost,127.0.0.1,[::1]",
        description="Host header values the API answers (comma-separated; '*' any); probes exempt",
    )
    cors_origins: str = Field(
        "", description="Origins (comma-separated) allowed cross-origin; default none: the page's own only"
    )
    docs: bool | None = Field(
        None, description="Serve /docs and /openapi.json (default: in development only)"
    )
    flower_url: str = Field(
        "", description="Flower's address, linked from the web page's status view (empty: no link)"
    )

    @model_validator(mode="after")
    def _production_needs_keys(self) -> Self:
        if self.env == "production" and not (self.api_keys or self.api_keys_file):
            raise ValueError("VLMQ_ENV=production needs VLMQ_API_KEYS or VLMQ_API_KEYS_FILE")
        if self.env == "production" and any(
            k.strip() in KNOWN_DEFAULTS for k in (self.api_keys or "").split(",")
        ):
            raise ValueError("VLMQ_API_KEYS holds a known default key: set your own")
        return self

    @property
    def serve_docs(self) -> bool:
        return self.docs if self.docs is not None else self.env == "development"


class DecodeWorkerSettings(CommonSettings):
    decode_concurrency: int = Field(2, description="Celery pool processes (or threads) for image decoding")
    decode_pool: Literal["prefork", "threads"] = Field(
        "prefork",
        description="Celery pool of the decode workers. prefork: a decoder crash or OOM costs one child and "
        "its task is redelivered at once; a hung decode hits the time limits. threads: no hand-off from "
        "the parent to a pool child (about 1.5 ms less per job at one client, bench/README.md), but a "
        "crash takes the whole node (its jobs return through the sweeper, VLMQ_STUCK_AFTER_S) "
        "and Celery enforces no time limit",
    )
    decode_ack_emulation: bool = Field(
        False,
        description="kombu's acknowledgement emulation for decode tasks (an unacked hash, redelivery after "
        "VLMQ_VISIBILITY_TIMEOUT_S). Off: two Redis round trips less per task in the Celery main process, "
        "on every job's path; a killed pool child's task is still requeued at once, and a dead node's "
        "jobs come back through the sweeper (VLMQ_STUCK_AFTER_S, sooner than the visibility timeout)",
    )
    visibility_timeout_s: int = Field(
        300, description="Redis broker redelivery of unacked decode tasks (with VLMQ_DECODE_ACK_EMULATION)"
    )
    decode_claim_max: int = Field(
        8,
        ge=0,
        le=64,
        description="Waiting decode jobs one task may take from its queue after its own, one at a time "
        "(worker/claims.py), when decoding falls behind: each skips Celery's dispatch (a backlog of 64 px "
        "PNGs: 2.5 -> 1.9 decode CPU-ms a job). Flower shows the claiming task only; 0: one job per task",
    )
    decode_linger_s: float = Field(
        1.0,
        ge=0.0,
        le=5.0,
        description="How long a task from the interactive queue waits, after its last job, for the next "
        "one (a BLMOVE of the queue into its claim: worker/claims.py), taking it without Celery's dispatch "
        "(one client: the queue hop 5.5 -> 3.0 ms with task events on, as under make up; 3.6 -> 2.5 ms off). "
        "Bounded by the claims' limits "
        "(VLMQ_DECODE_CLAIM_MAX jobs, 5 s a task). While every child waits, the worker fetches nothing "
        "else: batch jobs wait up to that long. 0: off",
    )
    jpeg_draft: bool = Field(True, description="Decode large JPEGs at reduced scale (Pillow draft mode)")
    jpeg_draft_oversample: float = Field(
        1.0, ge=1.0, le=8.0, description="Draft mode keeps >= this x the processor's output size per axis"
    )


class InferenceSettings(CommonSettings):
    device: str = Field("auto", description="auto|cpu|cuda")
    max_batch: int | None = Field(
        None, description="Running batch cap; default 8 on CPU, from free memory on GPU"
    )
    batch_window_ms: float = Field(10.0, description="Admission window after the first waiting request")
    stream_interval_ms: float = Field(
        20.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="Longest a generated token waits to be written with the next ones (one Redis write "
        "and one stream wake for several steps); a job's first token and its end never wait; 0: every "
        "engine step written at once",
    )
    prefill_min_free: int = Field(
        0,
        ge=0,
        description="While sequences run, a prefill waits (at most the admission window) until this many "
        "batch slots are free and waiters fill them; 0: half the batch, 1: refill each slot at once",
    )
    mix_padding_tokens: int = Field(
        64,
        ge=0,
        description="A prefill also steps the running sequences in its forward while their padding "
        "(rows x (prompt width - 1)) stays within this many token columns; 0: never",
    )
    warmup_requests: int = Field(
        0, ge=0, le=64, description="Dummy requests run before taking jobs (GPU: loads kernels; 0: none)"
    )
    pixels_on_device: Literal["auto", "true", "false"] = Field(
        "auto",
        description="Finish uint8 pictures (rescale, normalise, patchify) on the engine's device; "
        "auto: when it is not the CPU (there numpy's steps are as fast and run beside the engine)",
    )
    max_context_tokens: int = Field(2048, description="Prompt + completion token limit")
    prefix_cache: bool = Field(True, description="Reuse the system prompt's KV")
    session_cache: bool = Field(True, description="Keep a session's KV between turns")
    image_cache: bool = Field(True, description="Cache vision-encoder output by image digest")
    prefix_cache_mb: int = Field(64, description="Prefix cache bound")
    session_cache_mb: int = Field(512, description="Session cache bound")
    image_cache_mb: int = Field(256, description="Image-embedding cache bound")
    image_input_cache_mb: float = Field(
        128,
        ge=0,
        allow_inf_nan=False,
        description="Decoded images kept by digest as the decode workers ship them (the resized uint8 "
        "picture: 85 KB at the bundled model's 168 px), so a follow-up or a picture sent before needs no "
        "decode hop; 0: none (while such a worker runs, every job with images is decoded)",
    )
    worker_id: str | None = Field(None, description="Consumer name in the group; default host-pid")
    heartbeat_s: float = Field(2.0, description="Heartbeat period (and stats publication)")
    task_events: bool = Field(
        False,
        description="Send Celery task events for each job's inference stage, so Flower lists it beside "
        "decode (make up, compose and k8s turn it on with Flower)",
    )
    claim_idle_ms: int = Field(
        30_000, description="Idle time after which a pending entry is claimed (XAUTOCLAIM)"
    )
    max_deliveries: int = Field(3, description="Deliveries after which a job goes to the dead-letter state")
    drain_timeout_s: float = Field(
        20.0,
        description="On SIGTERM, how long in-flight jobs may finish before release (keep < claim idle)",
    )
    result_cache_ttl_s: int = Field(3600, description="Greedy result cache lifetime (written on done)")
    max_failed_steps: int = Field(
        3,
        ge=1,
        description="Engine steps in a row in which every sequence failed before the engine is unhealthy "
        "and the worker exits (code 75) to be restarted; a device error (CUDA error) exits at once",
    )
    priority_aging_s: float = Field(
        10.0, description="A batch job waiting this long in the engine is admitted like interactive work"
    )
    batch_hold_linger_s: float = Field(
        0.1,
        ge=0.0,
        description="Batch work stays held this long after the last interactive job ended (a client's "
        "next request follows its answer); only with VLMQ_BATCH_HOLD_S > 0",
    )
    affinity_max_wait_ms: int = Field(
        1000,
        description="A job routed to a busy worker that has not read it within this long moves to the "
        "shared stream (any worker takes it)",
    )
    gil_switch_interval_s: float = Field(
        0.0005,
        description="Python GIL switch interval: I/O threads (event writer, stream reader) wait at most "
        "this long for the engine thread (Python's default 5 ms delayed each token event)",
    )
    torch_threads: int = Field(
        0,
        description="torch intra-op threads of the inference worker; 0: OMP_NUM_THREADS if set, else half "
        "the CPUs (1 on a 2-core box, which the decode workers, gateway and Redis share)",
    )


@lru_cache
def get_gateway_settings() -> GatewaySettings:
    return GatewaySettings()


@lru_cache
def get_decode_worker_settings() -> DecodeWorkerSettings:
    return DecodeWorkerSettings()


@lru_cache
def get_inference_settings() -> InferenceSettings:
    return InferenceSettings()
