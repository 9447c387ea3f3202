"""The image formats vlmq accepts (gateway header check and decode worker allowlist agree)."""

from __future__ import annotations

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})  # Pillow format names
ALLOWED_TEXT = "JPEG, PNG, WebP"


def sniff_format(data: bytes) -> str | None:
    """The allowed format ``data`` starts like (magic bytes), or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None
