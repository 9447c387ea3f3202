"""Safe image decoding: bytes -> an RGB picture the image processor can take.

``decode_image`` refuses anything outside the allowlist, walks the structure first
(``shared.formats.check_structure``: marker/chunk floods and truncated files are refused before
Pillow parses them, since Pillow decodes a JPEG whose scan ends early, or a PNG without IEND, as if
whole), refuses decompression bombs from the header (before pixels are allocated), decodes big
JPEGs at reduced scale (draft mode: the DCT skips the detail the processor would throw away
anyway), applies the EXIF orientation and returns RGB. An MPO (a JPEG with more frames appended:
Ultra HDR, many phone photos) decodes its first frame; animated PNG/WebP are refused. The image
processor itself is ``services.vlm.image_processor``.
"""

from __future__ import annotations

import io
import math
import warnings

from PIL import Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from shared.formats import ALLOWED_TEXT, StructureError, check_structure, name_format, sniff_format
from shared.schemas import ErrorCode

CORRUPT = (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError)  # Pillow's usual errors
# Draft mode keeps at least this many times the processor's output resolution per axis for its
# resize (the DCT's scaled decode, then the processor's antialiased resize): 1.0 costs 0.4x the full
# decode's CPU with the same accuracy (bench/README.md, issue 18).
DRAFT_OVERSAMPLE = 1.0


class ImageRejected(ValueError):
    """An image the service refuses; the message is shown to the client as the job's error."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.BAD_IMAGE) -> None:
        super().__init__(message)
        self.code = code


def configure_pillow(max_pixels: int) -> None:
    """Make Pillow raise (not warn) on bombs: anything over ``max_pixels`` fails at open time."""
    Image.MAX_IMAGE_PIXELS = max_pixels
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def decode_image(
    data: bytes,
    max_pixels: int,
    target_pixels: int | None = None,
    draft: bool = True,
    oversample: float = DRAFT_OVERSAMPLE,
) -> Image.Image:
    """RGB image from ``data``; raises ImageRejected with a client-facing reason."""
    try:
        img = _open(data, max_pixels)
        if draft and target_pixels and img.format == "JPEG":
            img.draft("RGB", draft_size(img.size, target_pixels, oversample))
        img.load()
        img = ImageOps.exif_transpose(img) or img
        return img if img.mode == "RGB" else img.convert("RGB")
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected(f"image too large: {exc}") from exc
    except CORRUPT as exc:
        raise ImageRejected(f"corrupt or truncated image: {exc}") from exc
    except Exception as exc:  # Pillow on fuzzed files: struct.error, IndexError, TypeError, MemoryError...
        raise ImageRejected(f"image could not be decoded ({type(exc).__name__}: {exc})") from exc


def _open(data: bytes, max_pixels: int) -> Image.Image:
    fmt = _checked_format(data)
    try:
        img = _open_format(data, fmt)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning, *CORRUPT):
        raise  # decode_image words these
    except Exception as exc:  # a header Pillow cannot parse
        raise ImageRejected(f"image could not be decoded ({type(exc).__name__}: {exc})") from exc
    width, height = img.size
    if width <= 0 or height <= 0:
        raise ImageRejected("image has no pixels")
    if width * height > max_pixels:
        raise ImageRejected(f"image too large: {width}x{height} pixels exceeds the limit of {max_pixels}")
    if getattr(img, "n_frames", 1) > 1:
        raise ImageRejected("animated images are not supported")
    return img


def _checked_format(data: bytes) -> str:
    """The allowed format of ``data`` after the structure walk, else ImageRejected saying why."""
    fmt = sniff_format(data)
    if fmt is None:
        other = name_format(data)
        if other is None:
            raise ImageRejected("not an image (format not recognised)")
        raise ImageRejected(f"unsupported image format {other}; allowed: {ALLOWED_TEXT}")
    try:
        structure = check_structure(data, fmt)
    except StructureError as exc:
        prefix = "image refused" if exc.problem == "too_complex" else "corrupt or truncated image"
        raise ImageRejected(f"{prefix}: {exc}") from exc
    if structure.animated:
        raise ImageRejected("animated images are not supported")
    return fmt


def _open_format(data: bytes, fmt: str) -> Image.Image:
    # Plain JPEG on purpose: Pillow would open an MPO as a multi-frame "MPO"; its first frame is the image.
    if fmt == "JPEG":
        return JpegImagePlugin.JpegImageFile(io.BytesIO(data))  # its size is checked by _open
    return Image.open(io.BytesIO(data), formats=[fmt])


def draft_size(
    size: tuple[int, int], target_pixels: int, oversample: float = DRAFT_OVERSAMPLE
) -> tuple[int, int]:
    """Smallest size draft mode may reduce to: ``oversample`` x the processor's target per axis."""
    width, height = size
    scale = min(1.0, oversample * math.sqrt(target_pixels / (width * height)))
    return max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))
