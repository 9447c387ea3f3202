"""Fuzzed images and unexpected errors: every decode job ends settled (failed with a reason, or
handed to inference), never stuck in ``queued``/``decoding``."""

from __future__ import annotations

import random
import time

import pytest

from shared.schemas import JobStatus
from tests.support import jobs as J
from tests.support.stack import ServiceStack
from tests.worker.images import _jpeg_with_orientation
from tests.worker.test_decode_task import settled, submit
from worker.imaging import ImageRejected, configure_pillow, decode_image

BASES = {
    "jpeg": J.image_bytes("JPEG", (96, 64), seed=5),
    "jpeg_exif": _jpeg_with_orientation((64, 32), orientation=6),
    "png": J.image_bytes("PNG", (96, 64), seed=6),
    "webp": J.image_bytes("WEBP", (96, 64), seed=7),
}


def fuzzed(data: bytes, seed: int) -> bytes:
    """Flip a few bytes (often in the header), sometimes truncate."""
    rng = random.Random(seed)
    out = bytearray(data)
    span = len(out) if rng.random() < 0.5 else min(len(out), 160)
    for _ in range(rng.randint(1, 6)):
        out[rng.randrange(span)] = rng.randrange(256)
    if rng.random() < 0.3:
        out = out[: rng.randrange(12, len(out))]
    return bytes(out)


def variants(per_format: int) -> list[tuple[str, bytes]]:
    return [
        (f"{name}-{seed}", fuzzed(data, seed)) for name, data in BASES.items() for seed in range(per_format)
    ]


@pytest.mark.parametrize("name", list(BASES))
def test_fuzzed_images_decode_or_are_rejected_with_a_reason(name: str) -> None:
    """In-process: 150 variants per format; the only exception decode_image lets out is ImageRejected."""
    configure_pillow(40_000_000)
    for seed in range(150):
        try:
            img = decode_image(fuzzed(BASES[name], seed), 40_000_000, 200_000)
        except ImageRejected as exc:
            assert str(exc), f"{name}-{seed}: empty reason"
        else:
            assert img.mode == "RGB"


def test_fuzzed_images_through_the_worker_all_settle(decode_stack: ServiceStack) -> None:
    jobs = {name: submit(decode_stack, data) for name, data in variants(6)}
    for name, job_id in jobs.items():
        status = settled(decode_stack, job_id)
        assert status in (JobStatus.WAITING, JobStatus.FAILED), name
        record = J.job(decode_stack.redis, decode_stack.keys, job_id)
        if status is JobStatus.FAILED:
            assert record.error and record.error_code == "bad_image", (name, record.error)


def test_an_unexpected_error_fails_the_job_instead_of_leaving_it_queued(decode_stack: ServiceStack) -> None:
    """A job record the task cannot parse (a bug's stand-in): failed with a reason, worker still serving."""
    r, keys = decode_stack.redis, decode_stack.keys
    job_id = J.uuid.uuid4().hex
    r.hset(keys.job(job_id), mapping={"spec": '{"job_id": 1}', "status": "queued", "created_at": time.time()})
    decode_stack.enqueue_decode(job_id)
    assert settled(decode_stack, job_id) is JobStatus.FAILED
    assert b"internal error while decoding" in r.hget(keys.job(job_id), "error")
    assert r.hget(keys.job(job_id), "error_code") == b"internal"
    good = submit(decode_stack, J.image_bytes("JPEG", (64, 48), seed=9))
    assert settled(decode_stack, good) is JobStatus.WAITING
