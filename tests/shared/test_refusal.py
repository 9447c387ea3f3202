"""The cancel/deadline rule every stage applies before it works on a job."""

from __future__ import annotations

from shared.jobs import refusal
from shared.schemas import ErrorCode, JobStatus
from tests.support.jobs import make_spec


def test_cancelled_wins_over_expired() -> None:
    spec = make_spec(deadline=100.0)
    refused = refusal(spec, cancelled=True, before="decoding", now=200.0)
    assert (
        refused is not None and refused.status is JobStatus.CANCELLED and refused.code is ErrorCode.CANCELLED
    )


def test_past_the_deadline_expires_with_the_stage_named() -> None:
    refused = refusal(make_spec(deadline=100.0), cancelled=False, before="generation", now=100.5)
    assert refused is not None and refused.status is JobStatus.EXPIRED
    assert refused.error == "deadline passed before generation"


def test_a_job_in_time_or_without_deadline_goes_on() -> None:
    assert refusal(make_spec(deadline=100.0), cancelled=False, before="decoding", now=99.0) is None
    assert refusal(make_spec(), cancelled=False, before="decoding", now=1e12) is None
