"""``VLMQ_DECODE_POOL=threads``: one Celery process decodes on two threads, with the same results
as the prefork pool (every image's pixels, bad images failing their jobs only)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from services.vlm.image_processor import ImageProcessorHandle
from shared.schemas import JobStatus
from shared.tensors import unpack_image
from tests.support import jobs as J
from tests.support.stack import ServiceStack, running
from tests.worker.images import bad_images, good_images
from tests.worker.test_decode_task import settled, submit
from worker.imaging import configure_pillow, decode_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def threads_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    env = {"VLMQ_DECODE_POOL": "threads", "VLMQ_DECODE_CONCURRENCY": "2"}
    stack = ServiceStack(redis_url, tmp_path_factory.mktemp("threads-logs"), env, components=("decode",))
    with running(stack):
        yield stack


def test_threads_pool_decodes_in_one_process(threads_stack: ServiceStack) -> None:
    """No pool children; warmed up once; every image's pixels are the processor's own output, and a
    bad image fails its job while the others go on."""
    assert threads_stack.children("decode") == [], "the threads pool forks no children"
    log = threads_stack.procs["decode"].log()
    assert log.count("decode process ready") == 1, "one process, warmed up once"
    images = good_images()
    bad_name, (bad_data, reason) = next(iter(bad_images().items()))
    ids = {name: submit(threads_stack, data) for name, data in images.items()}
    bad = submit(threads_stack, bad_data)
    handle = ImageProcessorHandle.load(threads_stack.env["VLMQ_MODEL"])
    configure_pillow(threads_stack.settings.max_image_pixels)
    for name, job_id in ids.items():
        assert settled(threads_stack, job_id) is JobStatus.WAITING, name
        payload = threads_stack.redis.get(threads_stack.keys.job_pixels(job_id))
        assert payload is not None, name
        _made_by, got = unpack_image(payload)
        img = decode_image(images[name], threads_stack.settings.max_image_pixels, handle.target_pixels)
        assert torch.equal(handle.from_wire(got)["pixel_values"], handle(img)["pixel_values"]), name
    assert settled(threads_stack, bad) is JobStatus.FAILED, bad_name
    assert reason in (J.job(threads_stack.redis, threads_stack.keys, bad).error or "")
    assert threads_stack.procs["decode"].alive()
