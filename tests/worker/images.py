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
        "mpo_two_frames": mpo((160, 120), (80, 60)),
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
        "jpeg_com_flood": (com_flood(jpeg, 10_000_000), "more than 256 markers"),
        "png_chunk_flood": (chunk_flood(png, 10_000_000), "more than 256 chunks"),
        "jpeg_dqt_flood": (segment_flood(jpeg, 0xDB, b"\x00" + bytes(range(1, 65)), 150), "quantization"),
        "jpeg_photoshop_flood": (segment_flood(jpeg, 0xED, PHOTOSHOP_BLOCKS, 150), "Photoshop"),
        "png_ztxt_bomb": (ztxt_bomb(png, 250), "compressed text"),
        "jpeg_without_eoi": (jpeg[:-2], "truncated"),
        "jpeg_without_scan_data": (without_scan_data(jpeg), "no scan data"),
        "png_without_iend": (png[: png.rindex(b"IEND") - 4], "truncated"),
        "apng": (animated("PNG"), "animated"),
        "animated_webp": (animated("WEBP"), "animated"),
    }


def mpo(first: tuple[int, int], second: tuple[int, int]) -> bytes:
    """A real MPO (a JPEG with a second frame, as phones and Ultra HDR write): red, then green."""
    buf = io.BytesIO()
    Image.new("RGB", first, (220, 20, 20)).save(
        buf, "MPO", save_all=True, append_images=[Image.new("RGB", second, (20, 220, 20))]
    )
    return buf.getvalue()


def com_flood(jpeg: bytes, size: int) -> bytes:
    """``size`` bytes of empty COM segments right after SOI: valid, and seconds of Pillow header parsing."""
    return jpeg[:2] + b"\xff\xfe\x00\x02" * (size // 4) + jpeg[2:]


def chunk_flood(png: bytes, size: int) -> bytes:
    """``size`` bytes of empty ancillary chunks between IHDR and IDAT."""
    empty = _chunk(b"zzZz", b"")
    return png[:33] + empty * (size // len(empty)) + png[33:]


# Empty 8BIM resource blocks after the Photoshop header: Pillow parses each block in Python.
PHOTOSHOP_BLOCKS = b"Photoshop 3.0\x00" + b"8BIM\x00\x01\x00\x00\x00\x00\x00\x00" * 5000


def segment_flood(jpeg: bytes, marker: int, payload: bytes, count: int) -> bytes:
    """``count`` segments ``0xFF marker`` of ``payload`` (filled up to 64 KB by repeating it) after SOI:
    a DQT flood (Pillow parses every table) or an APP13 flood (every resource block): 1.6-2.3 s
    of Pillow header parsing at 10 MB."""
    body = (payload * (65_533 // len(payload) or 1))[:65_533]
    segment = bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body
    return jpeg[:2] + segment * count + jpeg[2:]


def ztxt_bomb(png: bytes, count: int) -> bytes:
    """``count`` zTXt chunks of 1 KB that Pillow inflates to 1 MB each (0.5 s and 64 MB per image)."""
    text = _chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"a" * (1024 * 1024 - 1), 9))
    return png[:33] + text * count + png[33:]


def without_scan_data(jpeg: bytes) -> bytes:
    """Everything up to the scan header, then the end marker: no pixels at all."""
    sos = jpeg.index(b"\xff\xda")
    length = struct.unpack(">H", jpeg[sos + 2 : sos + 4])[0]
    return jpeg[: sos + 2 + length] + b"\xff\xd9"


def animated(fmt: str) -> bytes:
    frames = [Image.new("RGB", (32, 32), (i * 80, 0, 0)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, fmt, save_all=True, append_images=frames[1:])
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int, height: int) -> bytes:
    """A tiny PNG declaring huge dimensions (a decompression bomb's header)."""

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


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
