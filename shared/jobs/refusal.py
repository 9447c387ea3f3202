"""The one rule every stage applies before it works on a job: cancelled or past its deadline
means finish it now (cancelled / expired), never decode nor run it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shared.schemas import ErrorCode, JobSpec, JobStatus


@dataclass(frozen=True)
class Refusal:
    status: JobStatus
    code: ErrorCode
    error: str | None


def refusal(spec: JobSpec, cancelled: bool, before: str, now: float | None = None) -> Refusal | None:
    """Why the job must not go on ``before`` a stage ("decoding", "generation"), or None."""
    if cancelled:
        return Refusal(JobStatus.CANCELLED, ErrorCode.CANCELLED, None)
    if past_deadline(spec, now):
        return Refusal(JobStatus.EXPIRED, ErrorCode.EXPIRED, f"deadline passed before {before}")
    return None


def past_deadline(spec: JobSpec, now: float | None = None) -> bool:
    return spec.deadline is not None and (time.time() if now is None else now) > spec.deadline
