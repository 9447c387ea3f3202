"""Rolling upgrades: the previous release's record and message shapes (schema v1) run through
today's stack, and today's (v2) records stay readable by a v1 reader, so workers of both
releases can serve one Redis while Deployments roll (``maxUnavailable: 0``)."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from services.vlm.image_processor import ImageProcessorHandle
from shared.conversations import load_messages
from shared.schemas import ChatTurn, JobStatus, SamplingSpec
from shared.tensors import pack_tensors
from tests.service.conftest import wait_done
from tests.support import jobs as J
from tests.support.reference import Reference
from tests.support.stack import ServiceStack
from worker.imaging import decode_image


class V1JobSpec(BaseModel):
    """The previous release's JobSpec, as its workers parse the ``spec`` field (frozen copy)."""

    job_id: str
    created_at: float
    deadline: float | None = None
    image_digest: str | None = None
    image_format: str | None = None
    messages: list[ChatTurn]
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    session_id: str | None = None
    use_cache: bool = True
    cancel_on_disconnect: bool = False
    source: Literal["jobs", "ws", "openai"] = "jobs"


def v1_job(stack: ServiceStack, prompt: str, digest: str, session_id: str, source: str) -> str:
    """A job exactly as the v1 gateway wrote it: no ``v``, ``session_id`` + ``source`` in the spec,
    no place in the active-jobs set (v1 had none)."""
    job_id, now = uuid.uuid4().hex, time.time()
    spec: dict[str, Any] = {
        "job_id": job_id,
        "created_at": now,
        "image_digest": digest,
        "image_format": "PNG",
        "messages": [{"role": "user", "text": prompt, "image": True}],
        "sampling": {"max_tokens": 6},
        "session_id": session_id,
        "source": source,
    }
    fields = {"spec": json.dumps(spec), "status": "queued", "attempt": "0", "created_at": str(now)}
    stack.redis.hset(stack.keys.job(job_id), mapping={**fields, "updated_at": str(now)})
    stack.redis.expire(stack.keys.job(job_id), 600)
    return job_id


async def test_v1_jobs_are_served_by_todays_workers(
    client: Any, service_stack: ServiceStack, reference: Reference
) -> None:
    stack = service_stack
    image = J.image_bytes("PNG", (168, 168), seed=77)
    digest = J.store_image(stack.redis, stack.keys, image)
    conversation = f"v1-{uuid.uuid4().hex[:8]}"
    stack.redis.hset(
        stack.keys.conversation(conversation), mapping={"image_digest": digest, "messages": "[]"}
    )
    ours = v1_job(stack, "What colour is the circle?", digest, conversation, "jobs")
    theirs = v1_job(stack, "What colour is the circle?", digest, "an-openai-user", "openai")
    for job_id in (ours, theirs):
        stack.enqueue_decode(job_id)  # the decode task's message is unchanged: vlmq.decode(job_id)
    for job_id in (ours, theirs):
        view = await wait_done(client, job_id, 60)
        assert view["status"] == JobStatus.DONE.value, view
        spec = J.job(stack.redis, stack.keys, job_id).spec
        assert view["final_text"] == reference.answer(spec, image)
    turns = load_messages(stack.redis.hget(stack.keys.conversation(conversation), "messages"))
    assert [t.role for t in turns] == ["user", "assistant"]  # the v1 conversation got its turn
    assert J.job(stack.redis, stack.keys, theirs).spec.conversation_id is None  # OpenAI: never stored
    assert not stack.redis.exists(stack.keys.conversation("an-openai-user"))


def store_v1_tensor(stack: ServiceStack, image: bytes, digest: str) -> None:
    """The previous release's decoded tensor of an image: the processor's whole output, float16,
    under the image's digest (today's decode workers store each job's resized pixels instead)."""
    handle = ImageProcessorHandle.load(stack.env["VLMQ_MODEL"])
    img = decode_image(image, stack.settings.max_image_pixels, handle.target_pixels)
    stack.redis.set(stack.keys.tensor(digest, handle.processor_id), pack_tensors(handle(img)), ex=600)


async def test_v1_stream_entries_are_served(client: Any, service_stack: ServiceStack) -> None:
    """A job a v1 decode worker handed over: status waiting, an entry with only ``job_id``."""
    stack = service_stack
    image = J.image_bytes("PNG", (168, 168), seed=78)
    spec = J.make_spec(digest=J.store_image(stack.redis, stack.keys, image), max_tokens=4)
    J.create_job(stack.redis, stack.keys, spec)
    stack.enqueue_decode(spec.job_id)
    done = await wait_done(client, spec.job_id, 60)
    again = J.make_spec(digest=spec.image_digest, max_tokens=4)
    store_v1_tensor(stack, image, spec.image_digest or "")  # what its v1 decode worker stored
    J.create_job(stack.redis, stack.keys, again)
    stack.redis.hset(stack.keys.job(again.job_id), "status", "waiting")
    stack.redis.xadd(stack.keys.inference_stream(), {"job_id": again.job_id})
    view = await wait_done(client, again.job_id, 60)
    assert view["status"] == "done" and view["final_text"] == done["final_text"]


async def test_todays_records_read_right_by_a_v1_reader(client: Any, service_stack: ServiceStack) -> None:
    image = J.image_bytes("PNG", (96, 96), seed=79)
    files = {"image": ("a.png", image, "image/png")}
    form = await client.post("/v1/jobs", data={"prompt": "Hi", "session_id": "conv-9"}, files=files)
    data_url = "data:image/png;base64," + base64.b64encode(image).decode()
    parts = [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": data_url}}]
    body = {
        "model": service_stack.settings.model_name,
        "user": "user-9",
        "messages": [{"role": "user", "content": parts}],
    }
    chat = await client.post("/v1/chat/completions", json=body)
    for job_id, session_id, source in (
        (form.json()["id"], "conv-9", "jobs"),
        (chat.headers["x-vlmq-job-id"], "user-9", "openai"),
    ):
        raw = service_stack.redis.hgetall(service_stack.keys.job(job_id))
        assert raw[b"v"] == b"2"
        old = V1JobSpec.model_validate_json(raw[b"spec"])
        assert (old.session_id, old.source) == (session_id, source)
