"""The job record: a Redis hash (``Keys.job``) beside its event stream (``Keys.job_events``).

Hash fields: ``spec`` (JobSpec JSON), ``status``, ``attempt``, ``created_at``, ``updated_at``,
``text`` (final text), ``finish_reason``, ``error``, ``usage`` (JSON), ``timings`` (JSON),
``result_cached`` ("1" when answered from the result cache), ``error_code`` (machine-readable
reason of a failed/expired/cancelled job: ``bad_image``, ``expired``, ``cancelled``, ``internal``,
...), ``finished_attempt`` (the attempt whose FINISH wrote the terminal state). Workers add
their own bookkeeping (``decode_attempts``, ``decode_started_at``, ``decode_s``, ``decode_task``,
``waiting_at``, ``published``) that ``JobRecord`` does not parse.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from shared.schemas import SCHEMA_VERSION, JobSpec, JobStatus, StageTimings, UsageInfo
from shared.values import as_str

EVENTS_MAXLEN = 100_000  # a job's event stream never grows without bound


class JobRecord(BaseModel):
    """The job hash, parsed."""

    spec: JobSpec
    status: JobStatus
    attempt: int = 0
    created_at: float
    updated_at: float
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    usage: UsageInfo | None = None
    timings: StageTimings | None = None
    result_cached: bool = False

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> JobRecord:
        fields = {as_str(k): as_str(v) for k, v in raw.items()}
        return cls(
            spec=JobSpec.model_validate_json(fields["spec"]),
            status=JobStatus(fields["status"]),
            attempt=int(fields.get("attempt", 0)),
            created_at=float(fields["created_at"]),
            updated_at=float(fields.get("updated_at", fields["created_at"])),
            text=fields.get("text"),
            finish_reason=fields.get("finish_reason"),
            error=fields.get("error"),
            error_code=fields.get("error_code"),
            usage=UsageInfo.model_validate_json(fields["usage"]) if "usage" in fields else None,
            timings=StageTimings.model_validate_json(fields["timings"]) if "timings" in fields else None,
            result_cached=fields.get("result_cached") == "1",
        )


def new_job_hash(spec: JobSpec) -> dict[str, str]:
    """Fields of a freshly accepted job (status queued)."""
    now = str(spec.created_at)
    return {
        "v": str(SCHEMA_VERSION),
        "spec": spec.model_dump_json(),
        "status": JobStatus.QUEUED.value,
        "attempt": "0",
        "created_at": now,
        "updated_at": now,
    }
