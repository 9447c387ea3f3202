"""GrowingLayer: appends give exactly what HF's concatenating DynamicLayer gives, without a copy per step."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from services.engine.architectures import Architecture
from services.engine.kv import BatchKV
from services.engine.kv_layer import HEADROOM, GrowingLayer


def _steps(n: int, cols: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    shape = (3, 2, cols, 8)
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(n)]


def test_appends_equal_concatenation_across_reallocations() -> None:
    grow, cat = GrowingLayer(), DynamicLayer()
    prompt = _steps(1, cols=20)[0]
    for layer in (grow, cat):
        layer.update(*prompt)
    for k, v in _steps(2 * HEADROOM + 5):
        gk, gv = grow.update(k, v)
        ck, cv = cat.update(k, v)
        assert torch.equal(gk, ck) and torch.equal(gv, cv)
    assert grow.get_seq_length() == cat.get_seq_length() == 20 + 2 * HEADROOM + 5


def test_decode_steps_write_in_place_until_the_headroom_is_used() -> None:
    layer = GrowingLayer()
    earlier, _ = layer.update(*_steps(1, cols=10)[0])
    before = earlier.clone()
    for k, v in _steps(HEADROOM):
        keys, _ = layer.update(k, v)
        assert keys.data_ptr() == earlier.data_ptr()  # no reallocation: no copy of the cache
    assert torch.equal(earlier, before)  # a view taken before the appends still shows what it showed
    keys, _ = layer.update(*_steps(1)[0])
    assert keys.data_ptr() != earlier.data_ptr()  # full: one reallocation


def test_tensors_adopted_from_outside_are_not_written_into() -> None:
    """``make_cache`` hands a layer tensors it does not own (a merged batch, a cached prefix)."""
    layer = GrowingLayer()
    k0, v0 = _steps(1, cols=6)[0]
    layer.lazy_initialization(k0, v0)
    layer.keys, layer.values = k0, v0
    k0_before = k0.clone()
    k, v = _steps(1)[0]
    out_k, _ = layer.update(k, v)
    assert torch.equal(out_k, torch.cat([k0_before, k], dim=-2))
    assert torch.equal(k0, k0_before) and out_k.data_ptr() != k0.data_ptr()
    # replaced again after growing (e.g. rows selected): the next update starts a new buffer
    layer.keys, layer.values = out_k[:2], layer.values[:2]
    k2, v2 = (t[:2] for t in _steps(1)[0])
    out_k2, _ = layer.update(k2, v2)
    assert torch.equal(out_k2, torch.cat([out_k[:2], k2], dim=-2))


def test_membership_changes_leave_room_for_the_next_decode_steps(bundled: tuple[Any, Any]) -> None:
    """Rows joining (merge) or leaving (remove) are copied once, into buffers the cache owns: the
    decode steps after them append in place, and the batch reads exactly what it held."""
    arch = Architecture(*bundled)
    g = torch.Generator().manual_seed(2)

    def batch(ids: list[str], length: int) -> BatchKV:
        b = BatchKV(arch.make_cache)
        shape = (len(ids), 2, length, 32)
        layers = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g))] * 4
        b.ids, b.cache, b.mask = ids, arch.make_cache(layers), torch.ones(len(ids), length, dtype=torch.bool)
        return b

    running, joining = batch(["a", "b"], 6), batch(["c"], 4)
    joined = torch.cat([torch.zeros(1, 2, 2, 32), joining.layers()[0][0]], -2)  # padded on the left
    want = torch.cat([running.layers()[0][0], joined])
    running.merge(joining)
    want = _decode_step_in_place(running, want, g, "a merge")
    running.remove({"b"})
    _decode_step_in_place(running, want[[0, 2]], g, "a remove")


def _decode_step_in_place(b: BatchKV, want: torch.Tensor, g: torch.Generator, after: str) -> torch.Tensor:
    assert torch.equal(b.layers()[0][0], want), after
    before = b.layers()[0][0].data_ptr()
    step = torch.randn(len(b), 2, 1, 32, generator=g)
    assert b.cache is not None
    layer = b.cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    keys, _ = layer.update(step, step)
    assert keys.data_ptr() == before, f"the decode step after {after} copied the cache"
    b.mask = torch.cat([b.mask, torch.ones(len(b), 1, dtype=torch.bool)], 1)
    return torch.cat([want, step], -2)
