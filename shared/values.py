"""Small conversions every process needs on Redis replies."""

from __future__ import annotations

from typing import Any


def as_str(value: Any) -> str:
    """A Redis reply value (bytes or str) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)
