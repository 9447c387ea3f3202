"""The checkpoint's image processor as both workers use it: loaded once, named by its config, and
split at its resize.

The decode worker runs the processor's steps up to and including its resize (``wire``) and ships
the resized picture as uint8: the cheapest exact form of what the model sees (168 x 168 x 3 bytes
for the bundled model, against 393 KB of float16 patches). The inference worker runs the rest
(rescale, normalise, patchify: ``finish``, ``from_wire``) with the same processor, or where those
steps are a table (``services.vlm.pixel_table``) the engine runs it on its device, so the pixel
values are the processor's own, bit for bit. Whether a processor splits exactly is checked once, at load,
on a probe picture; one that does not ships its full output (float16), as before.

``processor_id`` (hash of the config) travels with the pixels: pixels made by another processor
config are refused, never misread.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from services.vlm.loading import load_image_processor

if TYPE_CHECKING:
    from services.vlm.pixel_table import PixelTable

RESIZED = "pixels"  # the wire's name for the resized uint8 picture (channels first)
PROBE_SIDE_MAX = 2048  # the largest probe for the pixel budget the resize keeps (12 MB, once at load)


class _Resized(Exception):
    """Raised by the capturing resize: carries the processor's resized picture out of its pipeline."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__("resized")
        self.array = array


@dataclass
class ImageProcessorHandle:
    """The checkpoint's image processor, its id (hash of its config), its pixel budget, and
    whether its work splits exactly after the resize (``split``)."""

    processor: Any
    processor_id: str
    target_pixels: int | None  # pixels per image the resize keeps at most: draft decoding's aim
    split: bool = False
    direct: dict[str, Any] | None = None  # ``finish`` as one ``_preprocess`` call (``_direct_finish``)
    direct_resize: dict[str, Any] | None = None  # ``resize`` likewise (``_direct_resize``)
    # set by an inference worker (``engine_setup.attach_pixel_table``): the steps after the resize as
    # a table, where they are one; ``finish_on_device``: its engine makes the values from it there
    table: PixelTable | None = None
    finish_on_device: bool = False
    _capturing: Any = field(default=None, repr=False)  # the processor, resize captured (made once)

    @classmethod
    def load(cls, model_path: str | Path) -> ImageProcessorHandle:
        return cls.wrap(load_image_processor(model_path))

    @classmethod
    def wrap(cls, processor: Any) -> ImageProcessorHandle:
        handle = cls(processor, processor_id(processor), target_pixels(processor))
        handle._capturing = _capturing_copy(processor)
        handle.split = handle._splits_exactly()
        handle.direct_resize = handle._direct_resize()
        handle.target_pixels = handle._kept_pixels(handle.target_pixels)
        handle.direct = handle._direct_finish()
        return handle

    def __call__(self, img: Image.Image) -> dict[str, torch.Tensor]:
        """The processor's whole output for one picture."""
        out = self.processor(images=[img], return_tensors="pt")
        return {k: v for k, v in out.items() if hasattr(v, "dtype")}

    # --- the split ---
    def resize(self, img: Image.Image) -> np.ndarray:
        """The processor's steps up to and including its resize: the picture it goes on with
        (uint8, channels first). ``img`` is RGB (``worker.imaging.decode_image``): it goes in as a
        channels-first view of its bytes, sparing the processor's RGB conversion and its copies.
        Raises ValueError if the processor never resizes."""
        if img.mode != "RGB":
            img = img.convert("RGB")
        pixels = np.asarray(img).transpose(2, 0, 1)
        try:
            if self.direct_resize is not None:
                self._capturing._preprocess([pixels], **self.direct_resize)
            else:
                self._capturing(images=[pixels], do_convert_rgb=False, input_data_format="channels_first")
        except _Resized as done:
            return np.ascontiguousarray(done.array)
        raise ValueError("the image processor did not resize")

    def _direct_resize(self) -> dict[str, Any] | None:
        """The keyword arguments the processor's whole call hands its ``_preprocess`` (recorded
        once), where probes of several sizes show that calling ``_preprocess`` with them resizes bit
        for bit as the whole call does: the whole call validates and merges its arguments for every
        picture (more than half of ``resize``'s CPU besides Pillow's own, on the bundled model's).
        None otherwise: the whole call then runs for every picture."""
        if not self.split:
            return None
        recorder = copy.copy(self.processor)
        recorded: dict[str, Any] = {}

        def record(images: Any, *args: Any, **kwargs: Any) -> Any:
            if args:  # positional arguments: not a shape this can replay
                raise TypeError("positional arguments")
            recorded.update(kwargs)
            raise _Resized(np.empty(0))

        recorder._preprocess = record
        try:
            recorder(
                images=[self._channels_first(_probe())],
                do_convert_rgb=False,
                input_data_format="channels_first",
            )
        except _Resized:
            pass
        except Exception:
            return None
        if not recorded:
            return None
        return recorded if self._same_resize(recorded) else None

    def _same_resize(self, kwargs: dict[str, Any]) -> bool:
        for side in ((97, 131), (400, 300), (64, 64), (1000, 180)):
            pixels = self._channels_first(_probe(side))
            try:
                self._capturing._preprocess([pixels], **kwargs)
                return False  # never resized
            except _Resized as direct:
                try:
                    self._capturing(images=[pixels], do_convert_rgb=False, input_data_format="channels_first")
                    return False
                except _Resized as whole:
                    if direct.array.dtype != whole.array.dtype or not np.array_equal(
                        direct.array, whole.array
                    ):
                        return False
            except Exception:
                return False
        return True

    @staticmethod
    def _channels_first(img: Image.Image) -> np.ndarray:
        return np.asarray(img.convert("RGB")).transpose(2, 0, 1)

    def finish(self, pixels: np.ndarray) -> dict[str, torch.Tensor]:
        """The processor's steps after its resize, on what ``resize`` returned."""
        if self.direct is not None:
            out = self.processor._preprocess([pixels], **self.direct)
        else:
            out = self.processor(
                images=[pixels],
                do_resize=False,
                do_convert_rgb=False,
                input_data_format="channels_first",
                return_tensors="pt",
            )
        return {k: v for k, v in out.items() if hasattr(v, "dtype")}

    def _direct_finish(self) -> dict[str, Any] | None:
        """``_preprocess``'s keyword arguments from the processor's own settings, resize off, where a
        probe shows that one such call gives ``finish``'s output bit for bit: the processor's whole
        call re-checks and merges its arguments for every picture (a quarter of its time on the
        bundled model's). None otherwise (a processor without that step, or another signature)."""
        step = getattr(self.processor, "_preprocess", None)
        if not self.split or step is None:
            return None
        try:
            params = inspect.signature(step).parameters.values()
            names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            kwargs = {name: getattr(self.processor, name) for name in names if name != "images"}
            kwargs.update(do_resize=False, return_tensors="pt")
            pixels = self.resize(_probe())
            direct = step([pixels], **kwargs)
        except Exception:  # another signature, a setting it lacks: keep the whole call
            return None
        whole = self.finish(pixels)  # ``direct`` is still None here: the processor's whole call
        same = whole.keys() == {k for k, v in direct.items() if hasattr(v, "dtype")}
        return kwargs if same and all(torch.equal(whole[k], direct[k]) for k in whole) else None

    def _kept_pixels(self, configured: int | None) -> int | None:
        """The pixels the resize keeps of a picture over its budget, measured on a probe: GLM-4V's
        ``longest_edge`` counts a still image's two temporal frames, so it keeps half the configured
        pixels, and draft decoding aimed at the configured budget decoded at twice the scale it
        needs. The configured value where the probe cannot show it (no split, or a budget over
        ``PROBE_SIDE_MAX`` squared)."""
        if not configured or not self.split:
            return configured
        side = min(PROBE_SIDE_MAX, math.isqrt(configured) + 1)
        try:
            _channels, height, width = self.resize(Image.new("RGB", (side, side), (128, 128, 128))).shape
        except Exception:  # a processor that refuses the probe: keep its own figure
            return configured
        kept = height * width
        return kept if kept < 0.9 * side * side else configured  # else only rounded, not budgeted

    def _splits_exactly(self) -> bool:
        """``finish(resize(img))`` equals the processor's own output on a probe picture, bit for bit."""
        probe = _probe()
        try:
            whole, parts = self(probe), self.finish(self.resize(probe))
        except Exception:  # a processor whose steps cannot be taken apart ships its whole output
            return False
        return whole.keys() == parts.keys() and all(torch.equal(whole[k], parts[k]) for k in whole)

    # --- the wire ---
    def wire(self, img: Image.Image) -> dict[str, torch.Tensor]:
        """What the decode worker ships: the resized uint8 picture, or the whole output."""
        if self.split:
            return {RESIZED: torch.from_numpy(self.resize(img))}
        return self(img)

    def from_wire(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The processor's output (float32 pixel values) from what ``wire`` shipped."""
        if RESIZED in tensors:
            pixels = tensors[RESIZED]
            if pixels.dtype != torch.uint8 or pixels.ndim != 3:
                got = f"{pixels.dtype} {tuple(pixels.shape)}"
                raise ValueError(f"resized pixels must be uint8 (C, H, W), got {got}")
            return self.finish(pixels.numpy())
        return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def _probe(size: tuple[int, int] = (97, 131)) -> Image.Image:
    """A random picture (``size``: height, width) the processor's steps are checked on at load."""
    rng = np.random.default_rng(size[0] * 10007 + size[1])
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def _capturing_copy(processor: Any) -> Any:
    """A shallow copy of ``processor`` whose resize raises ``_Resized`` with its result: the whole
    pipeline (or ``_preprocess``) then stops right after the resize."""
    capturing = copy.copy(processor)
    original = capturing.resize

    def capture(image: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Resized(original(image, *args, **kwargs))

    capturing.resize = capture
    return capturing


def processor_id(processor: Any) -> str:
    """Short hash of the processor config: pixels made by another config never get reused."""
    config = json.loads(processor.to_json_string())
    config.pop("processor_class", None)
    blob = json.dumps(config, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def target_pixels(processor: Any) -> int | None:
    """The processor's configured pixel budget (Qwen2-VL/GLM-4V: ``size.longest_edge`` is max pixels)."""
    size = getattr(processor, "size", None) or {}
    value = size.get("longest_edge") or size.get("max_pixels") or getattr(processor, "max_pixels", None)
    return int(value) if value else None
