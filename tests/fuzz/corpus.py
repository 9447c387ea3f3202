"""A seeded corpus of hostile images: malformed, truncated, bombs, multi-frame, wrong formats,
floods, byte flips and cuts of valid JPEG/PNG/WebP/MPO files. Same seed, same bytes."""

from __future__ import annotations

import io
import random
import struct
import zlib
from dataclasses import dataclass

from PIL import Image

from tests.support.jobs import image_bytes
from tests.worker.images import (
    PHOTOSHOP_BLOCKS,
    animated,
    chunk_flood,
    com_flood,
    mpo,
    png_bomb,
    segment_flood,
    without_scan_data,
    ztxt_bomb,
)

KB = 1024


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes


def corpus(seed: int = 15, flips: int = 14, cuts: int = 8) -> list[Case]:
    rng = random.Random(seed)
    bases = valid_images()
    cases = [Case(f"valid/{name}", data) for name, data in bases.items()]
    cases += [Case(f"wrong-format/{name}", data) for name, data in wrong_formats().items()]
    cases += [Case(f"structure/{name}", data) for name, data in structural(bases).items()]
    for name, data in bases.items():
        cases += [Case(f"flip/{name}/{i}", flipped(data, rng)) for i in range(flips)]
        cases += [Case(f"cut/{name}/{i}", data[: rng.randrange(1, len(data))]) for i in range(cuts)]
    return cases


def valid_images() -> dict[str, bytes]:
    photo = Image.open(io.BytesIO(image_bytes("JPEG", (160, 120), seed=4))).convert("RGB")
    return {
        "jpeg": image_bytes("JPEG", (128, 96), seed=1),
        "jpeg-progressive": encode(photo, "JPEG", progressive=True),
        "jpeg-grey": encode(photo.convert("L"), "JPEG"),
        "jpeg-cmyk": encode(photo.convert("CMYK"), "JPEG"),
        "jpeg-restart-markers": encode(photo, "JPEG", restart_marker_blocks=2),
        "png": image_bytes("PNG", (96, 64), seed=2),
        "png-rgba": encode(photo.convert("RGBA"), "PNG"),
        "png-palette": encode(photo.convert("P"), "PNG"),
        "png-interlaced": interlaced_png(photo),
        "webp": image_bytes("WEBP", (96, 64), seed=3),
        "webp-lossless": encode(photo, "WEBP", lossless=True),
        "mpo": mpo((120, 90), (60, 45)),
    }


def wrong_formats() -> dict[str, bytes]:
    small = Image.new("RGB", (24, 16), (30, 60, 90))
    return {
        "gif": encode(small, "GIF"),
        "gif-animated": animated("GIF"),
        "bmp": encode(small, "BMP"),
        "tiff": encode(small, "TIFF"),
        "ico": encode(small, "ICO"),
        "svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
        "text": b"just some text, renamed to .png\n" * 20,
        "html": b"<!doctype html><html><body><img src=x onerror=alert(1)></body></html>",
        "pdf": b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\n",
        "empty": b"",
        "zeros": bytes(4 * KB),
        "random": random.Random(7).randbytes(8 * KB),
        "jpeg-magic-only": b"\xff\xd8\xff",
        "png-signature-only": b"\x89PNG\r\n\x1a\n",
        "riff-wave": b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(24),
    }


def structural(bases: dict[str, bytes]) -> dict[str, bytes]:
    jpeg, png, webp = bases["jpeg"], bases["png"], bases["webp"]
    eoi = jpeg.rindex(b"\xff\xd9")
    return {
        "jpeg-com-flood-1mb": com_flood(jpeg, 1024 * KB),
        "jpeg-app-flood": jpeg[:2] + b"\xff\xe5\x00\x04ab" * 4000 + jpeg[2:],
        "jpeg-fill-flood": jpeg[:2] + b"\xff" * (512 * KB) + jpeg[2:],
        "jpeg-junk-between-markers": jpeg[:2] + b"\x00" * (64 * KB) + jpeg[2:],
        "jpeg-tem-flood-in-scan": jpeg[:eoi] + b"\xff\x01" * (100 * KB) + jpeg[eoi:],
        "jpeg-stuffing-flood-in-scan": jpeg[:eoi] + b"\xff\x00" * (256 * KB) + jpeg[eoi:],
        "jpeg-dqt-flood": segment_flood(jpeg, 0xDB, b"\x00" + bytes(range(1, 65)), 8),
        "jpeg-photoshop-flood": segment_flood(jpeg, 0xED, PHOTOSHOP_BLOCKS, 8),
        "jpeg-exif-repeated": segment_flood(jpeg, 0xE1, b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x00\x00", 8),
        "jpeg-without-eoi": jpeg[:eoi],
        "jpeg-without-scan-data": without_scan_data(jpeg),
        "jpeg-cut-then-eoi": jpeg[: len(jpeg) // 2] + b"\xff\xd9",
        "jpeg-sof-bomb": jpeg_with_size(jpeg, 65_500, 65_500),
        "jpeg-sof-zero-height": jpeg_with_size(jpeg, 0, 64),
        "jpeg-segment-length-0": jpeg[:2] + b"\xff\xe0\x00\x00" + jpeg[2:],
        "jpeg-segment-past-end": jpeg[:2] + b"\xff\xe1\xff\xff" + b"x" * 100,
        "jpeg-trailing-garbage": jpeg + random.Random(3).randbytes(32 * KB),
        "jpeg-reserved-marker": jpeg[:2] + b"\xff\x02\x00\x04ab" + jpeg[2:],
        "mpo-second-frame-cut": bases["mpo"][: len(bases["mpo"]) - 200],
        "png-chunk-flood-1mb": chunk_flood(png, 1024 * KB),
        "png-chunk-flood-after-idat": png_chunks_after_idat(png, 20_000),
        "png-empty-idat-flood": png_empty_idats(png, 20_000),
        "png-ztxt-bomb": ztxt_bomb(png, 20),
        "png-without-iend": png[: png.rindex(b"IEND") - 4],
        "png-bomb-50000": png_bomb(50_000, 50_000),
        "png-bomb-36mp-tiny-idat": png_bomb(6_000, 6_000),
        "png-zero-width": png_bomb(0, 10),
        "png-huge-chunk-length": png[:33] + b"\x7f\xff\xff\xfftEXt" + b"x" * 64,
        "png-bad-chunk-type": png[:33] + b"\x00\x00\x00\x00\x00\x01\x02\x03" + png[33:],
        "png-no-ihdr": b"\x89PNG\r\n\x1a\n" + png[33:],
        "apng": animated("PNG"),
        "webp-animated": animated("WEBP"),
        "webp-riff-too-long": webp[:4] + struct.pack("<I", len(webp) * 10) + webp[8:],
        "webp-riff-zero": webp[:4] + b"\x00\x00\x00\x00" + webp[8:],
        "webp-unknown-chunk": webp[:12] + b"ABCD" + webp[16:],
        "webp-vp8x-bomb": webp_canvas(16_384, 16_384),
        "jpeg-header-png-body": jpeg[:200] + png,
        "png-header-jpeg-body": png[:33] + jpeg,
    }


def flipped(data: bytes, rng: random.Random) -> bytes:
    """A few random bytes changed, half the time within the header; sometimes cut as well."""
    out = bytearray(data)
    span = min(len(out), 200) if rng.random() < 0.5 else len(out)
    for _ in range(rng.randint(1, 6)):
        out[rng.randrange(span)] = rng.randrange(256)
    if rng.random() < 0.25:
        out = out[: rng.randrange(1, len(out))]
    return bytes(out)


def encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def interlaced_png(img: Image.Image) -> bytes:
    """Pillow cannot write Adam7; the same rows written as one non-interlaced image, flag set: a
    header that lies about its data (decoders must refuse or cope)."""
    data = bytearray(encode(img, "PNG"))
    data[28] = 1  # IHDR interlace method
    crc = zlib.crc32(bytes(data[12:29]))
    data[29:33] = struct.pack(">I", crc)
    return bytes(data)


def jpeg_with_size(jpeg: bytes, width: int, height: int) -> bytes:
    sof = jpeg.index(b"\xff\xc0")
    return jpeg[: sof + 5] + struct.pack(">HH", height, width) + jpeg[sof + 9 :]


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_chunks_after_idat(png: bytes, count: int) -> bytes:
    iend = png.rindex(b"IEND") - 4
    return png[:iend] + png_chunk(b"tEXt", b"k\x00v") * count + png[iend:]


def png_empty_idats(png: bytes, count: int) -> bytes:
    idat = png.index(b"IDAT") - 4
    return png[:idat] + png_chunk(b"IDAT", b"") * count + png[idat:]


def webp_canvas(width: int, height: int) -> bytes:
    """A VP8X header declaring a huge canvas, then nothing useful."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = b"WEBP" + vp8x
    return b"RIFF" + struct.pack("<I", len(body)) + body
