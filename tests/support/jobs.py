"""Submit jobs the way the gateway does (docs/service-contract.md §1), for worker tests."""

from __future__ import annotations

import hashlib
import io
import time
import uuid
from typing import Any

from PIL import Image

from shared.jobs import JobRecord, new_job_hash
from shared.keys import Keys
from shared.schemas import ChatTurn, JobEvent, JobSpec, JobStatus, SamplingSpec


def image_bytes(fmt: str = "JPEG", size: tuple[int, int] = (320, 240), seed: int = 0) -> bytes:
    """A procedurally drawn image (gradient + blocks) encoded as ``fmt``."""
    from PIL import ImageDraw

    img = Image.new("RGB", size, (seed * 37 % 256, 80, 160))
    draw = ImageDraw.Draw(img)
    w, h = size
    for i in range(6):
        x0, y0 = (i * w) // 7, (i * h) // 9
        draw.rectangle([x0, y0, x0 + w // 5, y0 + h // 5], fill=((i * 40 + seed) % 256, 200 - i * 20, i * 30))
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def make_spec(
    prompt: str = "What colour is the square?",
    digest: str | None = None,
    *,
    deadline: float | None = None,
    max_tokens: int = 8,
    conversation_id: str | None = None,
    use_cache: bool = True,
    history: list[ChatTurn] | None = None,
) -> JobSpec:
    turns = [*(history or []), ChatTurn(role="user", text=prompt, image=digest is not None and not history)]
    return JobSpec(
        job_id=uuid.uuid4().hex,
        created_at=time.time(),
        deadline=deadline,
        image_digest=digest,
        messages=turns,
        sampling=SamplingSpec(max_tokens=max_tokens),
        conversation_id=conversation_id,
        affinity_key=conversation_id,
        use_cache=use_cache,
    )


def store_image(r: Any, keys: Keys, data: bytes, ttl_s: int = 900) -> str:
    digest = hashlib.sha256(data).hexdigest()
    r.set(keys.image(digest), data, ex=ttl_s, nx=True)
    return digest


def create_job(r: Any, keys: Keys, spec: JobSpec, ttl_s: int = 3600) -> str:
    """Job hash + queued event + its place in the active set, as the gateway writes them (without
    enqueueing anything)."""
    job_key = keys.job(spec.job_id)
    r.hset(job_key, mapping=new_job_hash(spec))
    r.expire(job_key, ttl_s)
    r.zadd(keys.active_jobs(), {job_key: spec.created_at})
    r.xadd(keys.job_events(spec.job_id), JobEvent(type="status", status=JobStatus.QUEUED).to_fields())
    return spec.job_id


def job(r: Any, keys: Keys, job_id: str) -> JobRecord:
    return JobRecord.from_hash(r.hgetall(keys.job(job_id)))


def job_status(r: Any, keys: Keys, job_id: str) -> JobStatus | None:
    raw = r.hget(keys.job(job_id), "status")
    return JobStatus(raw.decode()) if raw else None


def events(r: Any, keys: Keys, job_id: str) -> list[JobEvent]:
    return [JobEvent.from_fields(fields) for _id, fields in r.xrange(keys.job_events(job_id))]
