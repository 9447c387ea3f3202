"""The image formats vlmq accepts, and a bounded walk of their structure.

The gateway's header check and the decode worker's allowlist agree on ``ALLOWED_FORMATS``. Both
call ``check_structure`` before Pillow sees the bytes. Pillow parses JPEG markers and PNG chunks
in Python, one at a time, and some contents too (quantization tables, EXIF, Photoshop resources,
compressed text): 10 MB of empty markers or chunks cost it 4-5 s, of tables or resource blocks
~2 s. This walk refuses such files after small caps that real files stay far below, and refuses
files that end early (a JPEG without scan data or end marker, a PNG without IEND), which Pillow
would answer as if whole. It is linear in the bytes; the JPEG's entropy-coded data is skipped by
a C-level regex search (~6 ms for 12 MB).

An MPO file (a JPEG followed by more frames: Ultra HDR, many phone photos) is a JPEG here: the
walk stops at the first frame's end marker, and the decoder reads that frame only.

Not caught: a JPEG cut inside its scan and given an end marker again. libjpeg fills the missing
blocks with grey and only warns, and Pillow drops libjpeg's warnings; spotting it would need the
entropy decode itself.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Literal

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})  # Pillow format names
ALLOWED_TEXT = "JPEG, PNG, WebP"

# Real photos carry a few dozen segments before the first scan (EXIF, XMP, ICC in 64 KB pieces,
# MPF, tables); a flood carries millions. Each one costs Pillow about a microsecond in Python.
MAX_JPEG_HEADER_SEGMENTS = 256  # markers before the first scan
MAX_JPEG_SEGMENTS = 2048  # markers of the first frame after its header (progressive files have a few dozen)
MAX_JPEG_JUNK_BYTES = 16 * 1024  # fill or stray bytes between header segments (Pillow skips them one by one)
# Segments Pillow parses in Python, costing time per byte (tables, IFD entries, resource blocks;
# repeated EXIF segments are concatenated, quadratically): what real files need, with room.
MAX_JPEG_PARSED_BYTES = {
    "quantization tables (DQT)": 4 * 1024,  # 4 tables of 130 bytes at most in a real file
    "EXIF (APP1)": 128 * 1024,  # one 64 KB segment by the standard
    "Photoshop resources (APP13)": 128 * 1024,
}
MAX_PNG_CHUNKS_BEFORE_IDAT = 256
MAX_PNG_CHUNKS = 16_384  # a 10 MB PNG of 8 KB IDAT chunks has 1,280
MAX_PNG_INFLATED_CHUNKS = 8  # zTXt, iTXt, iCCP: Pillow inflates each, up to 1 MB

Problem = Literal["corrupt", "truncated", "too_complex"]

_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})  # TEM, RST0-7, SOI, EOI: no length field
_JPEG_SOF = frozenset({*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), *range(0xCD, 0xD0)})
_SOS, _EOI = 0xDA, 0xD9
# In the header a marker may follow fill 0xFFs and stray bytes (0xFF00 among them: skipped, as
# libjpeg does); in entropy-coded data 0xFF is followed by 0x00 (stuffing) or RSTn, never a marker.
# One 0xFF then the marker byte: a run of fill bytes matches at its last 0xFF (no backtracking).
_HEADER_MARKER = re.compile(rb"\xff([^\x00\xff])")
_NEXT_MARKER = re.compile(rb"\xff([^\x00\xd0-\xd7\xff])")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHUNK_HEAD = struct.Struct(">I4s")
_PNG_INFLATED = frozenset({b"zTXt", b"iTXt", b"iCCP"})
_OTHER_FORMATS = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x0a", "JPEG XL"),
)


class StructureError(ValueError):
    """The bytes are not a well-formed, affordable image of their format; ``str()`` says why."""

    def __init__(self, message: str, problem: Problem) -> None:
        super().__init__(message)
        self.problem = problem


@dataclass(frozen=True)
class Structure:
    format: str  # JPEG | PNG | WEBP
    animated: bool  # more than one frame to show (APNG, animated WebP); an MPO's extra frames are not


def sniff_format(data: bytes) -> str | None:
    """The allowed format ``data`` starts like (magic bytes), or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if data[:8] == _PNG_SIGNATURE:
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def name_format(data: bytes) -> str | None:
    """A well-known image format outside the allowlist, for a clearer refusal; None if unknown."""
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in (b"heic", b"heix", b"mif1", b"avif", b"avis"):
        return "HEIF/AVIF"
    return None


def check_structure(data: bytes, fmt: str) -> Structure:
    """Walk ``data`` (already sniffed as ``fmt``); raises ``StructureError``."""
    walk = {"JPEG": _walk_jpeg, "PNG": _walk_png, "WEBP": _walk_webp}[fmt]
    return walk(data)


# --- JPEG ---
def _walk_jpeg(data: bytes) -> Structure:
    scan_start = _jpeg_header(data)
    if _jpeg_scans(data, scan_start) == 0:
        raise StructureError("JPEG has no scan data (no pixels after the scan header)", "truncated")
    return Structure("JPEG", animated=False)


def _jpeg_header(data: bytes) -> int:
    """Segments from SOI to the first scan header; returns where the scan's data starts."""
    pos, segments, junk, frame = 2, 0, 0, False
    parsed = dict.fromkeys(MAX_JPEG_PARSED_BYTES, 0)
    while True:
        marker, pos, junk = _header_marker(data, pos, junk)
        segments += 1
        if segments > MAX_JPEG_HEADER_SEGMENTS:
            raise StructureError(
                f"JPEG has more than {MAX_JPEG_HEADER_SEGMENTS} markers before its first scan", "too_complex"
            )
        if marker == _EOI:
            raise StructureError("JPEG ends before its first scan (end marker in the header)", "corrupt")
        if marker in _JPEG_STANDALONE:
            continue
        length = _segment_length(data, pos)
        _spend_parsed_bytes(parsed, _python_parsed(data, marker, pos), length)
        if marker in _JPEG_SOF:
            frame = True
        elif marker == _SOS:
            if not frame:
                raise StructureError("JPEG scan comes before its frame header", "corrupt")
            return pos + length
        pos += length


def _python_parsed(data: bytes, marker: int, pos: int) -> str | None:
    """Which of ``MAX_JPEG_PARSED_BYTES`` the segment at ``pos`` (its length field) counts against."""
    if marker == 0xDB:
        return "quantization tables (DQT)"
    if marker == 0xE1 and data.startswith(b"Exif\x00\x00", pos + 2):
        return "EXIF (APP1)"
    if marker == 0xED and data.startswith(b"Photoshop 3.0\x00", pos + 2):
        return "Photoshop resources (APP13)"
    return None


def _spend_parsed_bytes(parsed: dict[str, int], kind: str | None, length: int) -> None:
    if kind is None:
        return
    parsed[kind] += length
    if parsed[kind] > MAX_JPEG_PARSED_BYTES[kind]:
        limit = MAX_JPEG_PARSED_BYTES[kind]
        raise StructureError(f"JPEG has more than {limit} bytes of {kind}", "too_complex")


def _header_marker(data: bytes, pos: int, junk: int) -> tuple[int, int, int]:
    """The next marker at or after ``pos``: (marker, position after it, stray bytes so far)."""
    window = pos + MAX_JPEG_JUNK_BYTES - junk + 2
    found = _HEADER_MARKER.search(data, pos, window)
    if found is None:
        if window < len(data):
            raise StructureError(
                f"JPEG has over {MAX_JPEG_JUNK_BYTES} stray bytes between markers", "too_complex"
            )
        raise StructureError("JPEG ends before its first scan (truncated)", "truncated")
    marker = found.group(1)[0]
    if marker < 0xC0 and marker != 0x01:
        raise StructureError(f"JPEG has an invalid marker 0xFF{marker:02X}", "corrupt")
    return marker, found.end(), junk + found.start() - pos


def _segment_length(data: bytes, pos: int) -> int:
    if pos + 2 > len(data):
        raise StructureError("JPEG ends inside a segment header (truncated)", "truncated")
    length = int.from_bytes(data[pos : pos + 2], "big")
    if length < 2:
        raise StructureError(f"JPEG segment has an invalid length {length}", "corrupt")
    if pos + length > len(data):
        raise StructureError("JPEG ends inside a segment (truncated)", "truncated")
    return length


def _jpeg_scans(data: bytes, pos: int) -> int:
    """From the first scan's data to the first frame's end marker: the first scan's data length."""
    first_scan, segments = -1, 0
    while True:
        found = _NEXT_MARKER.search(data, pos)
        if found is None:
            raise StructureError("JPEG ends before its end-of-image marker (truncated)", "truncated")
        if first_scan < 0:
            first_scan = found.start() - pos
        marker, pos = found.group(1)[0], found.end()
        if marker == _EOI:
            return first_scan
        segments += 1
        if segments > MAX_JPEG_SEGMENTS:
            raise StructureError(f"JPEG has more than {MAX_JPEG_SEGMENTS} markers", "too_complex")
        if marker in _JPEG_STANDALONE:
            continue
        if marker < 0xC0:
            raise StructureError(f"JPEG has an invalid marker 0xFF{marker:02X}", "corrupt")
        pos += _segment_length(data, pos)


# --- PNG ---
def _walk_png(data: bytes) -> Structure:
    if data[12:16] != b"IHDR" or data[8:12] != b"\x00\x00\x00\x0d":
        raise StructureError("PNG does not start with its IHDR header chunk", "corrupt")
    pos, chunks, inflated, idat, frames = 8, 0, 0, False, 1
    while True:
        kind, length = _png_chunk(data, pos)
        chunks += 1
        inflated += kind in _PNG_INFLATED
        _check_png_counts(chunks, inflated, idat)
        if kind == b"acTL" and length >= 4:
            frames = int.from_bytes(data[pos + 8 : pos + 12], "big")
        elif kind == b"IDAT":
            idat = True
        elif kind == b"IEND":
            if not idat:
                raise StructureError("PNG has no image data (IDAT chunk)", "corrupt")
            return Structure("PNG", animated=frames > 1)
        pos += 12 + length


def _check_png_counts(chunks: int, inflated: int, idat: bool) -> None:
    if chunks > MAX_PNG_CHUNKS or (not idat and chunks > MAX_PNG_CHUNKS_BEFORE_IDAT):
        where = "in all" if idat else "before its image data"
        limit = MAX_PNG_CHUNKS if idat else MAX_PNG_CHUNKS_BEFORE_IDAT
        raise StructureError(f"PNG has more than {limit} chunks {where}", "too_complex")
    if inflated > MAX_PNG_INFLATED_CHUNKS:
        message = f"PNG has more than {MAX_PNG_INFLATED_CHUNKS} compressed text or profile chunks"
        raise StructureError(message, "too_complex")


def _png_chunk(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 8 > len(data):
        raise StructureError("PNG ends before its IEND chunk (truncated)", "truncated")
    length, kind = _PNG_CHUNK_HEAD.unpack_from(data, pos)
    if length >= 2**31 or not kind.isalpha():  # bytes.isalpha: ASCII letters only
        raise StructureError(f"PNG has an invalid chunk at byte {pos}", "corrupt")
    if pos + 12 + length > len(data):
        raise StructureError("PNG ends inside a chunk (truncated)", "truncated")
    return kind, length


# --- WebP ---
def _walk_webp(data: bytes) -> Structure:
    """RIFF size sane, first chunk a known image chunk; libwebp parses the rest in C."""
    if len(data) < 21:
        raise StructureError("WebP is too short for its headers (truncated)", "truncated")
    riff_size = int.from_bytes(data[4:8], "little")
    if riff_size < 12:
        raise StructureError(f"WebP declares an impossible RIFF size {riff_size}", "corrupt")
    if 8 + riff_size > len(data):
        raise StructureError("WebP is shorter than its RIFF header says (truncated)", "truncated")
    kind = data[12:16]
    if kind not in (b"VP8 ", b"VP8L", b"VP8X"):
        raise StructureError(f"WebP starts with an unknown chunk {kind!r}", "corrupt")
    animated = kind == b"VP8X" and bool(data[20] & 0x02)  # VP8X flags: animation bit
    return Structure("WEBP", animated=animated)
