"""``JobRun``: one attempt at one job on this worker, and what happens to it when it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.engine.api import FinishReason, TokenEvent
from services.inference_worker.stream_consumer import Entry
from shared.schemas import ErrorCode, EventType, JobSpec, JobStatus, UsageInfo


@dataclass
class JobRun:
    """What the writer needs to publish and finish an attempt. Changed only after a write succeeded."""

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
    token_writes: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens) of each token write
    first_token_at: float | None = None
    generating: bool = False
    diverged: str | None = None
    cancel_sent: bool = False
    released: bool = False  # handed back (shutdown, lost ownership, writer failure): events ignored

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def text(self) -> str:
        return "".join(self.texts)


@dataclass(frozen=True)
class Outcome:
    kind: EventType
    status: JobStatus
    finish_reason: str
    error: str | None = None
    error_code: str | None = None


def outcome(diverged: str | None, event: TokenEvent) -> Outcome:
    """How a finished attempt ends (event type, job status, finish reason, error)."""
    reason = event.finish_reason
    if diverged:
        return Outcome("error", JobStatus.FAILED, "error", diverged, ErrorCode.INTERNAL)
    if reason in (FinishReason.STOP, FinishReason.LENGTH):
        return Outcome("done", JobStatus.DONE, str(reason))
    if reason is FinishReason.CANCELLED:
        return Outcome("status", JobStatus.CANCELLED, "cancelled", None, ErrorCode.CANCELLED)
    if reason is FinishReason.REJECTED:  # the engine refused the prompt: the request's fault
        return Outcome("error", JobStatus.FAILED, "error", event.error, ErrorCode.INVALID_REQUEST)
    if reason is FinishReason.EXPIRED:
        error = "deadline passed during generation"
        return Outcome("status", JobStatus.EXPIRED, "expired", error, ErrorCode.EXPIRED)
    return Outcome("error", JobStatus.FAILED, "error", event.error or "generation failed", ErrorCode.INTERNAL)


def usage_info(event: TokenEvent) -> UsageInfo | None:
    if event.usage is None:
        return None
    u = event.usage
    return UsageInfo(
        prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens, cached_tokens=u.cached_tokens
    )
