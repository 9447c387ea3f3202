"""Image bytes for decode tests: good ones of each allowed format, and the usual bad ones."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

from tests.support.jobs import image_bytes


def good_images() -> dict[str, bytes]:
    return {
        "jpeg_small": image_bytes("JPEG", (64, 48), seed=1),
        "jpeg_1080p": image_bytes("JPEG", (1920, 1080), seed=2),
        "jpeg_4000x3000": image_bytes("JPEG", (4000, 3000), seed=3),
        "png_rgba": _png_rgba((300, 500)),
        "png_grey": _encode(Image.new("L", (200, 120), 90), "PNG"),
        "webp": image_bytes("WEBP", (640, 360), seed=4),
        "jpeg_exif_rotated": _jpeg_with_orientation((320, 160), orientation=6),
    }


def bad_images() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, substring the job's error must contain)."""
    jpeg = image_bytes("JPEG", (640, 480))
    png = image_bytes("PNG", (640, 480))
    webp = image_bytes("WEBP", (640, 480))
    return {
        "truncated_jpeg": (jpeg[: len(jpeg) // 2], "truncated"),
        "truncated_png": (png[: len(png) // 2], "truncated"),
        "truncated_webp": (webp[: len(webp) // 2], "corrupt"),
        "corrupt_jpeg": (jpeg[:200] + bytes(range(256)) * 20, "corrupt"),
        "not_an_image": (b"%PDF-1.4 this is not an image " * 50, "not an image"),
        "gif": (_encode(Image.new("P", (64, 64)), "GIF"), "unsupported image format GIF"),
        "bmp_renamed_png": (_encode(Image.new("RGB", (32, 32)), "BMP"), "unsupported image format BMP"),
        "png_bomb": (png_bomb(50_000, 50_000), "too large"),
    }


def png_bomb(width: int, height: int) -> bytes:
    """A tiny PNG declaring huge dimensions (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _png_rgba(size: tuple[int, int]) -> bytes:
    return _encode(Image.new("RGBA", size, (10, 200, 30, 128)), "PNG")


def _jpeg_with_orientation(size: tuple[int, int], orientation: int) -> bytes:
    img = Image.open(io.BytesIO(image_bytes("JPEG", size)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif.tobytes())
    return buf.getvalue()
