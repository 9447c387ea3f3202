"""Messages between vlmq processes (pydantic models; JSON on the wire).

Direction gateway -> workers: ``JobSpec`` (stored in the job hash, field ``spec``) and the
inference stream entry (``job_id`` + ``attempt``). Direction workers -> gateway: ``JobEvent``
entries of a job's event stream, and the job hash fields listed in ``JobRecord``.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, field_validator, model_validator


class JobStatus(enum.StrEnum):
    QUEUED = "queued"  # accepted, decode task enqueued
    DECODING = "decoding"  # a decode worker is on it
    WAITING = "waiting"  # tensor ready, in the inference stream
    GENERATING = "generating"  # admitted into the running batch
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})


class ResponseFormat(BaseModel):
    """Structured output: any JSON object, or JSON valid against ``json_schema`` (checked by the
    gateway, as canonical JSON text). None on a ``SamplingSpec``: free text."""

    type: Literal["json_object", "json_schema"]
    json_schema: str | None = None
    name: str | None = None


class SamplingSpec(BaseModel):
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    min_tokens: int = 0  # no EOS and no stop string before this many tokens (vLLM's min_tokens)
    ignore_eos: bool = False  # generate past EOS until max_tokens or a stop string (vLLM's ignore_eos)
    response_format: ResponseFormat | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class ChatTurn(BaseModel):
    """One message of a conversation: ``images`` are the digests of the images it shows (in order),
    ``image`` whether it shows any. ``image_at`` says where each image sits in the message: the
    offset in ``text`` it comes before (text and images interleaved as the client sent them);
    without it every image comes before the text (a previous release ignores it and does that). A
    turn of the previous release has ``image`` and no ``images``: it shows its job's ``image_digest``."""

    role: Literal["system", "user", "assistant"]
    text: str
    image: bool = False
    images: list[str] = Field(default_factory=list)
    image_at: list[int] = Field(default_factory=list)

    @field_validator("images", "image_at", mode="before")
    @classmethod
    def _lua_empty_list(cls, value: Any) -> Any:
        """Redis' cjson writes an empty list back as ``{}`` (APPEND_TURN_LUA re-encodes the turns)."""
        return [] if value == {} else value

    def digests(self, legacy: str | None) -> list[str]:
        """The images this turn shows (``legacy``: the job's one image, for a previous-release turn)."""
        if self.images:
            return self.images
        return [legacy] if self.image and legacy else []


SCHEMA_VERSION = 2  # of every record and message vlmq writes (rolling upgrades read the previous one)


class JobSpec(BaseModel):
    """Everything a worker needs to run a job. Image bytes are never inside: only the digest.

    Version 1 (the previous release) had ``session_id`` (a conversation for jobs and chat
    WebSocket requests, only an affinity key for OpenAI ones, told apart by ``source``) where
    version 2 has ``conversation_id`` and ``affinity_key``. A v1 spec is read as v2; a v2 spec
    still carries ``session_id`` so a v1 worker serving beside it during a rolling upgrade
    records conversations as before.
    """

    v: int = SCHEMA_VERSION
    job_id: str
    created_at: float
    deadline: float | None = None
    image_digest: str | None = None  # the conversation's first image (its turns name every one)
    image_format: str | None = None
    messages: list[ChatTurn]
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    conversation_id: str | None = None  # the stored conversation this turn is recorded in (None: none)
    affinity_key: str | None = None  # names the engine's session KV kept between a client's turns
    use_cache: bool = True  # False bypasses engine caches (exactness tests, benchmarks)
    cancel_on_disconnect: bool = False
    source: Literal["jobs", "ws", "openai"] = "jobs"  # the route it came by (a metrics label)
    tenant: str | None = None  # who submitted it (None: an open gateway); nobody else sees it
    priority: Literal["interactive", "batch"] = "interactive"  # interactive goes first, batch ages in
    traceparent: str | None = None  # W3C context of the gateway's span (shared.tracing); None: untraced

    def image_digests(self) -> list[str]:
        """Every image the conversation shows, each once, in order of first appearance."""
        seen: dict[str, None] = {}
        for turn in self.messages:
            seen.update(dict.fromkeys(turn.digests(self.image_digest)))
        return list(seen)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def session_id(self) -> str | None:
        """What a v1 reader expects: the conversation, or else the affinity key."""
        return self.conversation_id or self.affinity_key

    @model_validator(mode="before")
    @classmethod
    def _from_v1(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "session_id" not in data:
            return data
        data = dict(data)
        session_id = data.pop("session_id")  # v2: derived again from the fields below
        if data.get("v", 1) < 2:
            data.setdefault("affinity_key", session_id)
            data.setdefault("conversation_id", None if data.get("source") == "openai" else session_id)
            data["v"] = SCHEMA_VERSION
        return data


class StageTimings(BaseModel):
    """Seconds per stage, the seeds' latency table per job."""

    queue: float = 0.0  # accepted -> decode started
    decode: float = 0.0  # image bytes -> tensor
    wait: float = 0.0  # tensor ready -> admitted into a batch
    vision: float = 0.0
    prefill: float = 0.0
    generation: float = 0.0
    ttft: float = 0.0  # accepted -> first token
    total: float = 0.0  # accepted -> terminal


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ErrorCode(enum.StrEnum):
    """Why a job did not end ``done``: stored in the job hash (``error_code``), mapped to HTTP codes."""

    BAD_IMAGE = "bad_image"  # the image could not be decoded or processed (client's fault)
    IMAGE_EXPIRED = "image_expired"  # bytes/tensor gone before use: send the image again
    INVALID_REQUEST = "invalid_request"  # the engine refused the request (too long, ...)
    EXPIRED = "expired"  # deadline passed
    CANCELLED = "cancelled"
    QUEUE_UNAVAILABLE = "queue_unavailable"  # the decode task could not be enqueued
    INTERNAL = "internal"  # a bug or a worker crash (dead letter)


EventType = Literal["status", "token", "done", "error"]


class JobEvent(BaseModel):
    """One entry of a job's event stream. ``attempt`` separates the tokens of a retried job."""

    type: EventType
    attempt: int = 1
    status: JobStatus | None = None
    text: str | None = None  # token text delta
    token_ids: list[int] | None = None
    index: int | None = None  # completion tokens before this event
    finish_reason: str | None = None
    final_text: str | None = None
    usage: UsageInfo | None = None
    timings: StageTimings | None = None
    error: str | None = None
    error_code: str | None = None  # bad_image | expired | cancelled | internal | ... (see ErrorCode)

    def to_fields(self) -> dict[str, str]:
        return {"data": self.model_dump_json(exclude_none=True)}

    @classmethod
    def from_fields(cls, fields: dict[Any, Any]) -> JobEvent:
        raw = fields.get(b"data", fields.get("data"))
        if raw is None:
            raise ValueError("event entry has no 'data' field")
        return cls.model_validate_json(raw)
