"""The worker's decoded-image cache: bounded in bytes, least recently used first out."""

from __future__ import annotations

import torch

from services.engine.api import ImageInput
from services.inference_worker.image_inputs import ImageInputCache, input_bytes


def image(digest: str, patches: int = 4) -> ImageInput:
    grid = torch.tensor([[1, 2, patches // 2]])
    return ImageInput(pixel_values=torch.rand(patches, 8), image_grid_thw=grid, digest=digest)


def test_sizes_count_every_tensor() -> None:
    assert input_bytes(image("a", 4)) == 4 * 8 * 4 + 3 * 8  # float32 pixels + int64 grid


def test_serves_all_or_nothing_and_evicts_the_least_recently_used() -> None:
    one = input_bytes(image("x"))
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
    cache = ImageInputCache(max_bytes=input_bytes(image("x")) + 1)
    cache.put_all({"a": image("a")})
    again = image("a")
    cache.put_all({"a": again})
    assert cache.get_all(["a"]) == {"a": again} and cache.bytes == input_bytes(again)
    cache.put_all({"big": image("big", patches=64)})
    assert cache.get_all(["big"]) is None and cache.get_all(["a"]) is not None
    nothing = ImageInputCache(max_bytes=0)
    nothing.put_all({"a": image("a")})
    assert nothing.get_all(["a"]) is None and nothing.bytes == 0


def test_the_writer_thread_sees_what_is_held_and_what_was_evicted() -> None:
    cache = ImageInputCache(max_bytes=2 * input_bytes(image("x")))
    cache.put_all({"a": image("a"), "b": image("b")})
    assert cache.holds("a") and cache.holds("b") and not cache.evicted
    cache.put_all({"a": image("a")})  # stored again: replaced in place, the newest, not evicted
    cache.put_all({"c": image("c")})
    assert list(cache.evicted) == ["b"] and not cache.holds("b") and cache.holds("c") and cache.holds("a")
    assert cache.bytes == 2 * input_bytes(image("x"))
