"""The worker's decoded-image cache: bounded in bytes, least recently used first out; it keeps each
picture as its decode worker shipped it, and a turn served from it gets the engine input fresh
pixels give, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from services.inference_worker.engine_request import pixels_input
from services.inference_worker.image_inputs import ImageInputCache, PixelsNeeded, Wire, wire_bytes
from services.inference_worker.job_images import job_images
from services.inference_worker.job_store import JobStore
from services.vlm.image_processor import ImageProcessorHandle
from shared.keys import Keys
from shared.tensors import pack_image
from tests.support import models
from tests.support.jobs import image_bytes, make_spec
from worker.imaging import decode_image


def image(digest: str, side: int = 4) -> Wire:
    """A picture as a decode worker ships it (``digest`` only names it in the tests' dicts)."""
    return {"pixels": torch.randint(0, 256, (3, side, side), dtype=torch.uint8)}


def test_sizes_count_every_tensor() -> None:
    wire = {"pixels": torch.zeros(3, 4, 4, dtype=torch.uint8), "grid": torch.zeros(1, 3, dtype=torch.int64)}
    assert wire_bytes(wire) == 3 * 4 * 4 + 3 * 8


def test_serves_all_or_nothing_and_evicts_the_least_recently_used() -> None:
    one = wire_bytes(image("x"))
    cache = ImageInputCache(max_bytes=2 * one)
    a, b, c = image("a"), image("b"), image("c")
    cache.put_all({"a": a, "b": b})
    assert cache.get_all(["a", "b"]) == {"a": a, "b": b}
    assert cache.get_all(["a", "z"]) is None  # one missing: none of them
    assert cache.get_all([]) is None
    assert cache.get_all(["a"]) == {"a": a}  # a is now the most recently used
    cache.put_all({"c": c})
    assert cache.get_all(["b"]) is None and cache.get_all(["a", "c"]) == {"a": a, "c": c}
    stats = cache.stats()
    assert stats["entries"] == 2 and stats["bytes"] == cache.bytes == 2 * one and stats["evictions"] == 1
    assert (stats["hits"], stats["misses"]) == (3, 3)


def test_a_second_put_replaces_and_an_oversized_image_is_not_kept() -> None:
    cache = ImageInputCache(max_bytes=wire_bytes(image("x")) + 1)
    cache.put_all({"a": image("a")})
    again = image("a")
    cache.put_all({"a": again})
    assert cache.get_all(["a"]) == {"a": again} and cache.bytes == wire_bytes(again)
    cache.put_all({"big": image("big", side=64)})
    assert cache.get_all(["big"]) is None and cache.get_all(["a"]) is not None
    nothing = ImageInputCache(max_bytes=0)
    nothing.put_all({"a": image("a")})
    assert nothing.get_all(["a"]) is None and nothing.bytes == 0


def test_the_writer_thread_sees_what_is_held_and_what_was_evicted() -> None:
    cache = ImageInputCache(max_bytes=2 * wire_bytes(image("x")))
    cache.put_all({"a": image("a"), "b": image("b")})
    assert cache.holds("a") and cache.holds("b") and not cache.evicted
    cache.put_all({"a": image("a")})  # stored again: replaced in place, the newest, not evicted
    cache.put_all({"c": image("c")})
    assert list(cache.evicted) == ["b"] and not cache.holds("b") and cache.holds("c") and cache.holds("a")
    assert cache.bytes == 2 * wire_bytes(image("x"))


def test_a_held_picture_is_kept_as_shipped_and_gives_fresh_pixels_input(
    redis_client: Any, keys: Keys
) -> None:
    """The real processor: a job with pixels keeps its picture as the uint8 wire (an eighth of its
    float32 input's bytes); a later turn without pixels gets the same input, bit for bit."""
    handle = ImageProcessorHandle.load(models.test_model_path())
    data = image_bytes("JPEG", (333, 222), seed=5)
    digest = "d" * 64
    payload = pack_image(handle.processor_id, handle.wire(decode_image(data, 10**8, handle.target_pixels)))
    fresh = pixels_input(handle, payload, digest)  # what a job with these pixels gets
    held, store = ImageInputCache(max_bytes=2**20), JobStore(redis_client, keys, 3600, 900)
    first = job_images(held, store, handle, make_spec(digest=digest), payload, skipped=False)[digest]
    assert first.pixel_values is not None and fresh.pixel_values is not None
    assert torch.equal(first.pixel_values, fresh.pixel_values)
    float32_bytes = fresh.pixel_values.element_size() * fresh.pixel_values.nelement()
    assert held.bytes * 8 == float32_bytes  # one byte a value against four, each frame once against twice
    first.pixel_values.zero_()  # what the cache hands out is the caller's: the kept picture is not
    later = job_images(held, store, handle, make_spec(digest=digest), None, skipped=True)[digest]
    assert later.digest == digest and later.pixel_values is not None
    assert torch.equal(later.pixel_values, fresh.pixel_values)
    assert torch.equal(later.image_grid_thw, fresh.image_grid_thw)
    assert held.stats()["hits"] == 1
    with pytest.raises(PixelsNeeded):
        job_images(ImageInputCache(2**20), store, handle, make_spec(digest=digest), None, skipped=True)
