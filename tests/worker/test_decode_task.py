"""The decode task through a real Celery worker process and a real Redis."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import threading
import time
import uuid

import pytest
import torch
from PIL import Image

from services.vlm.image_processor import ImageProcessorHandle
from shared.config import DecodeWorkerSettings
from shared.decode_task import DECODE_TASK
from shared.schemas import JobStatus
from shared.tensors import unpack_image
from tests.support import jobs as J
from tests.support.stack import ServiceStack, wait_for
from tests.worker.images import bad_images, good_images
from worker.celery_app import make_app
from worker.claims import job_of
from worker.imaging import configure_pillow, decode_image

pytestmark = pytest.mark.slow


def submit(stack: ServiceStack, data: bytes | None, **spec_kwargs: object) -> str:
    digest = J.store_image(stack.redis, stack.keys, data) if data is not None else None
    spec = J.make_spec(digest=digest, **spec_kwargs)  # type: ignore[arg-type]
    J.create_job(stack.redis, stack.keys, spec)
    stack.enqueue_decode(spec.job_id)
    return spec.job_id


def settled(stack: ServiceStack, job_id: str) -> JobStatus:
    def done() -> JobStatus | None:
        status = J.job_status(stack.redis, stack.keys, job_id)
        return status if status and (status.terminal or status is JobStatus.WAITING) else None

    return wait_for(done, 60, what=f"job {job_id} decoded")


def test_images_become_the_jobs_resized_pixels(decode_stack: ServiceStack) -> None:
    """The job's pixels: the processor's resized picture, uint8, named by the processor's id; the
    processor's steps after the resize turn them into exactly its own output."""
    images = good_images()
    ids = {name: submit(decode_stack, data) for name, data in images.items()}
    handle = ImageProcessorHandle.load(decode_stack.env["VLMQ_MODEL"])
    configure_pillow(decode_stack.settings.max_image_pixels)
    queued = [
        e[1][b"job_id"].decode() for e in decode_stack.redis.xrange(decode_stack.keys.inference_stream())
    ]
    for name, job_id in ids.items():
        assert settled(decode_stack, job_id) is JobStatus.WAITING, name
        payload = decode_stack.redis.get(decode_stack.keys.job_pixels(job_id))
        assert payload is not None, f"{name}: no pixels stored for the job"
        made_by, got = unpack_image(payload)
        img = decode_image(images[name], decode_stack.settings.max_image_pixels, handle.target_pixels)
        assert made_by == handle.processor_id and got["pixels"].dtype == torch.uint8, name
        assert len(payload) < 90_000, f"{name}: {len(payload)} bytes on the wire"
        want, finished = handle(img), handle.from_wire(got)
        assert torch.equal(finished["pixel_values"], want["pixel_values"]), name
        assert torch.equal(finished["image_grid_thw"], want["image_grid_thw"]), name
        assert job_id in queued or _in_stream(decode_stack, job_id), f"{name}: not handed to inference"
        assert float(decode_stack.redis.hget(decode_stack.keys.job(job_id), "decode_s")) > 0


def _in_stream(stack: ServiceStack, job_id: str) -> bool:
    return any(f[b"job_id"].decode() == job_id for _i, f in stack.redis.xrange(stack.keys.inference_stream()))


DECODE_LINE = re.compile(r"job ([0-9a-f]{32}): \w+ .*\(\d+\.\d ms, task [0-9a-f-]{36}\)")


def test_one_log_line_per_decode_names_job_task_and_outcome(decode_stack: ServiceStack) -> None:
    """At INFO the decode's own line only: Celery's per-task received/succeeded lines are off."""
    job_id = submit(decode_stack, J.image_bytes("JPEG", (64, 48), seed=21))
    assert settled(decode_stack, job_id) is JobStatus.WAITING
    wait_for(
        lambda: f"job {job_id}: waiting" in decode_stack.procs["decode"].log(), 10, what="the job's line"
    )
    log = decode_stack.procs["decode"].log().splitlines()
    lines = [line for line in log if job_id in line]
    found = re.search(r"\(\d+\.\d ms, task ([0-9a-f-]{36})\)", lines[0])
    assert len(lines) == 1 and found, lines
    task_lines = [line for line in log if found.group(1) in line]  # its own job's, and those it took
    assert all(DECODE_LINE.search(line) for line in task_lines), "Celery's own lines for the task"


def test_bad_images_fail_the_job_and_the_worker_keeps_serving(decode_stack: ServiceStack) -> None:
    pid = decode_stack.procs["decode"].pid
    cases = bad_images()
    ids = {name: submit(decode_stack, data) for name, (data, _reason) in cases.items()}
    good = submit(decode_stack, J.image_bytes("PNG", (100, 100), seed=9))
    for name, job_id in ids.items():
        assert settled(decode_stack, job_id) is JobStatus.FAILED, name
        record = J.job(decode_stack.redis, decode_stack.keys, job_id)
        assert cases[name][1] in (record.error or ""), (name, record.error)
        last = J.events(decode_stack.redis, decode_stack.keys, job_id)[-1]
        assert last.type == "error" and last.error == record.error
        assert not _in_stream(decode_stack, job_id)
    assert settled(decode_stack, good) is JobStatus.WAITING
    assert decode_stack.procs["decode"].alive() and decode_stack.procs["decode"].pid == pid
    assert "WorkerLostError" not in decode_stack.procs["decode"].log()


def test_expired_and_cancelled_jobs_are_never_decoded(decode_stack: ServiceStack) -> None:
    data = J.image_bytes("JPEG", (200, 200), seed=11)
    expired = submit(decode_stack, data, deadline=time.time() - 1)
    spec = J.make_spec(digest=J.store_image(decode_stack.redis, decode_stack.keys, data))
    J.create_job(decode_stack.redis, decode_stack.keys, spec)
    decode_stack.redis.set(decode_stack.keys.job_cancel(spec.job_id), 1)
    decode_stack.enqueue_decode(spec.job_id)
    assert settled(decode_stack, expired) is JobStatus.EXPIRED
    assert settled(decode_stack, spec.job_id) is JobStatus.CANCELLED
    assert not decode_stack.redis.exists(decode_stack.keys.job_pixels(expired))
    assert not decode_stack.redis.exists(decode_stack.keys.job_pixels(spec.job_id))
    assert not _in_stream(decode_stack, expired) and not _in_stream(decode_stack, spec.job_id)


def test_each_job_gets_its_own_pixels_from_the_stored_bytes(decode_stack: ServiceStack) -> None:
    """A later turn about the same image decodes the stored upload again (its TTL renewed): pixels
    are the job's own and go with it, so nothing per image outlives the jobs but the bytes."""
    data = J.image_bytes("WEBP", (500, 300), seed=12)
    first = submit(decode_stack, data)
    assert settled(decode_stack, first) is JobStatus.WAITING
    digest = J.job(decode_stack.redis, decode_stack.keys, first).spec.image_digest
    assert digest is not None
    decode_stack.redis.expire(decode_stack.keys.image(digest), 5)
    later = J.make_spec("And its size?", digest=digest)  # a later turn: the image by its digest
    J.create_job(decode_stack.redis, decode_stack.keys, later)
    decode_stack.enqueue_decode(later.job_id)
    second = later.job_id
    assert settled(decode_stack, second) is JobStatus.WAITING
    first_pixels, second_pixels = (
        decode_stack.redis.get(decode_stack.keys.job_pixels(j)) for j in (first, second)
    )
    assert first_pixels is not None and first_pixels == second_pixels
    assert decode_stack.redis.ttl(decode_stack.keys.image(digest)) > 5  # renewed by the second decode


def test_task_message_carries_the_job_id_only(decode_stack: ServiceStack) -> None:
    """Publish to a key space no worker reads, then read the raw message from Redis."""
    settings = DecodeWorkerSettings(
        _env_file=None,
        redis_url=decode_stack.settings.redis_url,  # type: ignore[call-arg]
        key_prefix=f"idle-{uuid.uuid4().hex[:6]}",
    )
    app = make_app(settings)
    try:
        job_id = uuid.uuid4().hex
        app.send_task(DECODE_TASK, args=[job_id])
        raw = decode_stack.redis.lrange(settings.keys.decode_queue(), 0, -1)
    finally:
        app.close()
    assert len(raw) == 1
    message = json.loads(raw[0])
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == DECODE_TASK
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [job_id] and kwargs == {}


def test_task_events_are_published_for_flower(decode_stack: ServiceStack) -> None:
    app = decode_stack.celery_app()
    seen: list[dict] = []
    ready = threading.Event()
    receivers: list = []

    def capture() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            with contextlib.suppress(TimeoutError, OSError):
                receiver.capture(limit=None, timeout=15, wakeup=False)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.5)  # the receiver's subscription is in place
    decode_stack.no_decode_task_waiting()  # else a task waiting for jobs takes this one: no task of its own
    job_id = submit(decode_stack, J.image_bytes("JPEG", (120, 90), seed=13))
    assert settled(decode_stack, job_id) is JobStatus.WAITING
    wait_for(lambda: any(e.get("type") == "task-succeeded" for e in seen), 10, what="task-succeeded event")
    receivers[0].should_stop = True
    thread.join(5)
    received = [e for e in seen if e.get("type") == "task-received"]
    assert received and job_id in received[-1]["args"]


def test_decode_child_killed_mid_task_is_redelivered(decode_stack: ServiceStack) -> None:
    """Late ack + reject on worker lost: SIGKILL the pool child while it decodes; the job still gets there."""
    img = Image.linear_gradient("L").resize((6000, 6000)).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    job_id = submit(decode_stack, buf.getvalue())
    wait_for(
        lambda: J.job_status(decode_stack.redis, decode_stack.keys, job_id) is JobStatus.DECODING,
        30,
        interval_s=0.005,
        what="decoding started",
    )
    children = decode_stack.children("decode")
    assert children, "celery main process has no pool child"
    # no acknowledgement emulation: the running task is in no unacked hash (a Redis round trip less)
    assert not list(decode_stack.redis.scan_iter(match="*unacked*"))
    os.kill(children[0], signal.SIGKILL)
    assert settled(decode_stack, job_id) is JobStatus.WAITING
    assert int(decode_stack.redis.hget(decode_stack.keys.job(job_id), "decode_attempts")) == 2
    assert (
        sum(
            1
            for _i, f in decode_stack.redis.xrange(decode_stack.keys.inference_stream())
            if f[b"job_id"].decode() == job_id
        )
        == 1
    )  # handed over exactly once


def test_job_whose_decodes_keep_dying_is_dead_lettered(decode_stack: ServiceStack) -> None:
    """decode_attempts already at the cap (earlier deliveries died): the next one fails the job."""
    data = J.image_bytes("JPEG", (100, 80), seed=14)
    spec = J.make_spec(digest=J.store_image(decode_stack.redis, decode_stack.keys, data))
    J.create_job(decode_stack.redis, decode_stack.keys, spec)
    decode_stack.redis.hset(decode_stack.keys.job(spec.job_id), "decode_attempts", 3)
    decode_stack.enqueue_decode(spec.job_id)
    assert settled(decode_stack, spec.job_id) is JobStatus.FAILED
    assert "dead letter" in (J.job(decode_stack.redis, decode_stack.keys, spec.job_id).error or "")


def big_png(seed: int) -> bytes:
    """A picture that takes the decode child a second or more (an 6000 x 6000 PNG)."""
    img = Image.linear_gradient("L").rotate(seed).resize((6000, 6000)).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def decoding(stack: ServiceStack, job_id: str) -> None:
    wait_for(
        lambda: J.job_status(stack.redis, stack.keys, job_id) is JobStatus.DECODING,
        30,
        interval_s=0.005,
        what=f"{job_id} decoding",
    )


def decoded_by(stack: ServiceStack, job_id: str) -> str:
    return (stack.redis.hget(stack.keys.job(job_id), "decode_task") or b"").decode()


def test_a_busy_decoder_takes_the_waiting_jobs_in_its_task(decode_stack: ServiceStack) -> None:
    """One pool child, busy: the jobs queued behind it are decoded in its task, not a task each
    (Celery's main process may hold one of them already: that one runs as its own task)."""
    pictures = [J.image_bytes("JPEG", (90, 70), seed=40 + i) for i in range(4)]
    decode_stack.no_decode_task_waiting()  # else a task waiting for jobs takes the slow one too
    counters = decode_stack.keys.metrics_counters()
    claimed_before = int(decode_stack.redis.hget(counters, "decode_claimed_jobs_total") or 0)
    slow = submit(decode_stack, big_png(1))
    decoding(decode_stack, slow)
    waiting = [submit(decode_stack, data) for data in pictures]
    for job_id in [slow, *waiting]:
        assert settled(decode_stack, job_id) is JobStatus.WAITING
    task = decoded_by(decode_stack, slow)
    claimed = [job_id for job_id in waiting if decoded_by(decode_stack, job_id) == task]
    assert task and len(claimed) >= len(waiting) - 1, [decoded_by(decode_stack, j) for j in waiting]
    claimed_after = int(decode_stack.redis.hget(counters, "decode_claimed_jobs_total") or 0)
    assert claimed_after - claimed_before == len(claimed)  # vlmq_decode_claimed_jobs_total
    decode_stack.no_decode_task_waiting()  # the task waits for more jobs a while, then ends
    assert sorted(_in_stream_ids(decode_stack, [slow, *waiting])) == sorted([slow, *waiting])


def test_a_claimed_job_whose_decoder_dies_is_decoded_again(decode_stack: ServiceStack) -> None:
    """The child dies while decoding a job it claimed: the claiming task is requeued, and its kept
    claim goes back to the queue (when it runs again, or when another task claims its message). The
    job is decoded again by another task, charged one more attempt, and handed over once."""
    pictures = [big_png(3 + i) for i in range(4)]  # made first: the first decode must outlast the submits
    decode_stack.no_decode_task_waiting()
    first = submit(decode_stack, pictures[0])
    decoding(decode_stack, first)
    behind = [submit(decode_stack, data) for data in pictures[1:]]  # one is claimed by the first's task
    task = wait_for(lambda: decoded_by(decode_stack, first) or None, 60, what="the first job handed over")
    claim_key = decode_stack.keys.decode_claim(task)
    message = wait_for(lambda: decode_stack.redis.get(claim_key), 30, interval_s=0.005, what="a claim")
    claimed = job_of(message)
    assert claimed in behind
    decoding(decode_stack, claimed)
    os.kill(decode_stack.children("decode")[0], signal.SIGKILL)
    for job_id in behind:
        assert settled(decode_stack, job_id) is JobStatus.WAITING
    assert int(decode_stack.redis.hget(decode_stack.keys.job(claimed), "decode_attempts")) == 2
    assert decoded_by(decode_stack, claimed) not in ("", task)  # not the task that died
    assert sorted(_in_stream_ids(decode_stack, [first, *behind])) == sorted([first, *behind])  # once each


def _in_stream_ids(stack: ServiceStack, job_ids: list[str]) -> list[str]:
    entries = stack.redis.xrange(stack.keys.inference_stream())
    return [f[b"job_id"].decode() for _i, f in entries if f[b"job_id"].decode() in job_ids]


def test_a_task_waits_for_the_next_job_and_takes_it(decode_stack: ServiceStack) -> None:
    """After its job, a task waits (``VLMQ_DECODE_LINGER_S``) for the interactive queue's next one
    and decodes it itself: no dispatch by Celery's main process, which fetches nothing while its one
    child waits. Once the wait lapses, the task ends and the next job has a task of its own."""
    decode_stack.no_decode_task_waiting()
    counters = decode_stack.keys.metrics_counters()
    claimed_before = int(decode_stack.redis.hget(counters, "decode_claimed_jobs_total") or 0)
    first = submit(decode_stack, J.image_bytes("JPEG", (90, 70), seed=60))
    assert settled(decode_stack, first) is JobStatus.WAITING
    task = decoded_by(decode_stack, first)
    claim_key = decode_stack.keys.decode_claim(task)
    wait_for(lambda: decode_stack.redis.type(claim_key) == b"list", 10, what="the task waiting for a job")
    following = [submit(decode_stack, J.image_bytes("PNG", (80, 60), seed=61 + i)) for i in range(2)]
    for job_id in following:
        assert settled(decode_stack, job_id) is JobStatus.WAITING
        assert decoded_by(decode_stack, job_id) == task
    claimed_after = int(decode_stack.redis.hget(counters, "decode_claimed_jobs_total") or 0)
    assert claimed_after - claimed_before == len(following)
    decode_stack.no_decode_task_waiting()
    later = submit(decode_stack, J.image_bytes("JPEG", (90, 70), seed=63))
    assert settled(decode_stack, later) is JobStatus.WAITING
    assert decoded_by(decode_stack, later) not in ("", task)


def test_sigterm_ends_a_tasks_wait_not_its_child(decode_stack: ServiceStack) -> None:
    """SIGTERM to every process of the worker (``make up``'s stop, systemd) reaches a child whose task
    waits for a job: the wait ends and the task returns (no WorkerLostError, no message requeued),
    the child lives on for the main process's shutdown and claims no more. Last in this module: its
    child stays that way."""
    decode_stack.no_decode_task_waiting()
    job_id = submit(decode_stack, J.image_bytes("JPEG", (90, 70), seed=70))
    assert settled(decode_stack, job_id) is JobStatus.WAITING
    task = decoded_by(decode_stack, job_id)
    claim_key = decode_stack.keys.decode_claim(task)
    wait_for(lambda: decode_stack.redis.type(claim_key) == b"list", 10, what="the task waiting for a job")
    [child] = decode_stack.children("decode")
    seen = len(decode_stack.procs["decode"].log())
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: not decode_stack.redis.exists(claim_key), 10, what="the wait ended")
    wait_for(lambda: "stopped waiting for jobs (SIGTERM)" in decode_stack.procs["decode"].log()[seen:], 10)
    later = submit(decode_stack, J.image_bytes("JPEG", (90, 70), seed=71))
    assert settled(decode_stack, later) is JobStatus.WAITING
    assert decoded_by(decode_stack, later) not in ("", task)  # a task of its own, on the same child
    assert decode_stack.children("decode") == [child]
    assert "WorkerLostError" not in decode_stack.procs["decode"].log()[seen:]
    assert not list(decode_stack.redis.scan_iter(decode_stack.keys.decode_claim("*")))  # no more waits
