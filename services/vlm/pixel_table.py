"""The image processor's last steps (rescale, normalise, patchify) as a table and a reshape, so the
engine can finish a picture shipped as uint8 on its own device.

Rescale and normalise act on each byte value of each channel alone, so the processor's own outputs
for the 256 values of every channel, read once at load, give them exactly; the patches are the
picture's pixels reordered (the Qwen2-VL / GLM-4V layout: a still image's frame repeated over the
temporal patch, merge groups of patches next to each other). On a device the table is a gather and
the patches a copy: no arithmetic, so the values are the processor's own there too. ``build`` makes
a table only where probes show it equal to the processor's ``finish`` bit for bit.

Why: with GLM-4V's 14 px patches a 1008 px picture is 24 MB of float32 patches against 3 MB of
uint8, and the processor's steps take ~10 ms of the inference worker's main thread (bench/README.md,
the twelfth session); on a GPU the engine uploads the uint8 picture and finishes it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

BYTE_VALUES = 256
PROBE_SIZES = ((2, 3), (3, 1), (1, 4))  # probe pictures, in merge groups of patches (height, width)


class Finishing(Protocol):
    """What a table is read from: ``services.vlm.image_processor.ImageProcessorHandle``."""

    processor: Any
    split: bool

    def finish(self, pixels: np.ndarray) -> dict[str, torch.Tensor]: ...


@dataclass
class PixelTable:
    values: torch.Tensor  # (channels, 256) float32: the processor's output for each byte value
    patch: int
    temporal: int
    merge: int
    _on_device: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, handle: Finishing) -> PixelTable | None:
        """The processor's table, where its steps after the resize are one (else None: a processor
        without patch sizes, one whose values depend on where a pixel is, or whose patches are laid
        out otherwise keeps ``ImageProcessorHandle.from_wire``)."""
        if not handle.split:
            return None
        try:
            table = cls._read(handle)
            return table if table is not None and table._matches(handle) else None
        except Exception:  # a processor that refuses the probes: it keeps its own steps
            return None

    @classmethod
    def _read(cls, handle: Finishing) -> PixelTable | None:
        p = handle.processor
        patch, temporal, merge = int(p.patch_size), int(p.temporal_patch_size), int(p.merge_size)
        side = patch * merge
        columns = []
        for value in range(BYTE_VALUES):
            out = handle.finish(np.full((3, side, side), value, np.uint8))["pixel_values"]
            per_channel = out.reshape(out.shape[0], 3, -1)
            if not bool((per_channel == per_channel[:1, :, :1]).all()):  # values that depend on place
                return None
            columns.append(per_channel[0, :, 0])
        values = torch.stack(columns, dim=1).to(torch.float32).contiguous()
        return cls(values, patch, temporal, merge) if bool(torch.isfinite(values).all()) else None

    def _matches(self, handle: Finishing) -> bool:
        rng = np.random.default_rng(20261207)
        side = self.patch * self.merge
        for rows, cols in PROBE_SIZES:
            picture = rng.integers(0, BYTE_VALUES, (3, rows * side, cols * side), dtype=np.uint8)
            whole = handle.finish(picture)
            if set(whole) != {"pixel_values", "image_grid_thw"}:
                return False
            mine = torch.from_numpy(picture)
            if not torch.equal(self.finish(mine), whole["pixel_values"]):
                return False
            if not torch.equal(self.grid(tuple(mine.shape)), whole["image_grid_thw"]):
                return False
        return True

    # --- use ---
    def takes(self, picture: torch.Tensor) -> bool:
        """A uint8 picture (channels, height, width) in whole merge groups of patches: what the
        decode worker's resize makes (anything else is left to the processor, which says why not)."""
        side = self.patch * self.merge
        return (
            picture.dtype == torch.uint8
            and picture.ndim == 3
            and picture.shape[0] == self.values.shape[0]
            and all(n > 0 and n % side == 0 for n in picture.shape[1:])
        )

    def grid(self, shape: tuple[int, ...]) -> torch.Tensor:
        """``image_grid_thw`` of a picture of ``shape`` (channels, height, width)."""
        _channels, height, width = shape
        return torch.tensor([[1, height // self.patch, width // self.patch]])

    def patches_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The shape of ``finish``'s output for a picture of ``shape`` (channels, height, width)."""
        channels, height, width = shape
        return (height // self.patch) * (width // self.patch), channels * self.temporal * self.patch**2

    def finish(self, picture: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
        """The processor's ``pixel_values`` (float32) of a uint8 picture (channels, height, width),
        made on ``device`` (default: where the picture is)."""
        picture = picture.to(device) if device is not None else picture
        table = self._table(picture.device)
        channels = picture.shape[0]
        # int32 indices (index_select takes them): a quarter of int64's transient memory on the device
        offsets = torch.arange(channels, device=picture.device, dtype=torch.int32).view(channels, 1, 1)
        indices = (picture.int() + offsets * BYTE_VALUES).flatten()
        values = table.index_select(0, indices).view(picture.shape)  # (channels, height, width) float32
        return self._patches(values)

    def _patches(self, values: torch.Tensor) -> torch.Tensor:
        channels, height, width = values.shape
        p, t, m = self.patch, self.temporal, self.merge
        rows, cols = height // p, width // p
        frames = values.unsqueeze(0).expand(t, channels, height, width)  # a still image, t times
        grouped = frames.reshape(t, channels, rows // m, m, p, cols // m, m, p)
        # -> (row groups, column groups, row in group, column in group, channel, frame, y, x)
        ordered = grouped.permute(2, 5, 3, 6, 1, 0, 4, 7)
        return ordered.reshape(rows * cols, channels * t * p * p)

    def _table(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = self.values.flatten().to(device)
        return self._on_device[key]
