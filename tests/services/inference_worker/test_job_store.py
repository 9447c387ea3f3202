"""``JobStore`` round trips against a real Redis (no engine): beginning an attempt, pixels."""

from __future__ import annotations

from typing import Any

import pytest

from services.inference_worker.job_store import JobStore
from shared.keys import Keys
from shared.schemas import JobStatus
from tests.support import jobs as J


def _store(r: Any, keys: Keys) -> JobStore:
    return JobStore(r, keys, job_ttl_s=3600, image_ttl_s=900)


def test_begin_loads_the_job_counts_the_attempt_and_reads_the_cancel_flag(
    redis_client: Any, keys: Keys
) -> None:
    store = _store(redis_client, keys)
    spec = J.make_spec()
    J.create_job(redis_client, keys, spec)
    first = store.begin(spec.job_id)
    assert first is not None and first.attempt == 1 and not first.cancelled
    assert first.record.spec == spec and first.record.status is JobStatus.QUEUED
    assert first.fields["created_at"] == str(spec.created_at)
    redis_client.set(keys.job_cancel(spec.job_id), 1)
    second = store.begin(spec.job_id)
    assert second is not None and second.attempt == 2 and second.cancelled
    assert redis_client.hget(keys.job(spec.job_id), "attempt") == b"2"


def test_begin_never_creates_nor_restarts_a_job(redis_client: Any, keys: Keys) -> None:
    store = _store(redis_client, keys)
    assert store.begin("no-such-job") is None
    assert not redis_client.exists(keys.job("no-such-job"))  # HINCRBY did not create a stub hash
    spec = J.make_spec()
    J.create_job(redis_client, keys, spec)
    redis_client.hset(keys.job(spec.job_id), "status", JobStatus.DONE.value)
    done = store.begin(spec.job_id)
    assert done is not None and done.attempt == 0 and done.record.status is JobStatus.DONE
    assert redis_client.hget(keys.job(spec.job_id), "attempt") == b"0"


def test_begin_reads_the_jobs_pixels(redis_client: Any, keys: Keys) -> None:
    store = _store(redis_client, keys)
    spec = J.make_spec()
    J.create_job(redis_client, keys, spec)
    assert (begun := store.begin(spec.job_id)) is not None and begun.pixels is None
    redis_client.set(keys.job_pixels(spec.job_id), b"packed")
    assert (begun := store.begin(spec.job_id)) is not None and begun.pixels == b"packed"


def test_missing_legacy_tensor_is_a_lookup_error(redis_client: Any, keys: Keys) -> None:
    with pytest.raises(LookupError):
        _store(redis_client, keys).legacy_image("0" * 64, "proc")
