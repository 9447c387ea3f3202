"""Write (or ``--check``) ``.env.example``: every ``VLMQ_*`` setting with its default and description.

Generated from the pydantic-settings classes, so it cannot drift: ``python -m scripts.env_example``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic_settings import BaseSettings

from scripts.up import UpSettings
from shared.config import CommonSettings, DecodeWorkerSettings, GatewaySettings, InferenceSettings

ROOT = Path(__file__).resolve().parents[1]
SECTIONS: list[tuple[str, type[BaseSettings]]] = [
    ("Common (every process)", CommonSettings),
    ("Gateway", GatewaySettings),
    ("Decode workers (Celery)", DecodeWorkerSettings),
    ("Inference worker", InferenceSettings),
    ("make up (scripts/up.py)", UpSettings),
]


def render() -> str:
    lines = [
        "# vlmq settings: every VLMQ_* variable and its default (`python -m scripts.env_example`).",
        "# Copy to .env and uncomment what you change; real environment variables win over .env.",
        "",
    ]
    seen: set[str] = set()
    for title, cls in SECTIONS:
        lines.append(f"# --- {title} ---")
        for name, field in cls.model_fields.items():
            if name in seen:
                continue
            seen.add(name)
            default = "" if field.default is None else _value(field.default)
            lines.append(f"# {field.description or ''}")
            lines.append(f"# VLMQ_{name.upper()}={default}")
        lines.append("")
    return "\n".join(lines)


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def main(argv: list[str]) -> int:
    path = ROOT / ".env.example"
    text = render()
    if "--check" in argv:
        ok = path.exists() and path.read_text() == text
        print(".env.example is up to date" if ok else ".env.example is stale: python -m scripts.env_example")
        return 0 if ok else 1
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
