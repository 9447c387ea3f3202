"""The secrets `make up` makes for a local stack when none are configured, kept in the run folder
so they survive restarts: an API key (admin, tenant ``local``) and Flower's password.

Set your own with ``VLMQ_API_KEYS`` / ``VLMQ_API_KEYS_FILE`` and ``VLMQ_FLOWER_USER`` /
``VLMQ_FLOWER_PASSWORD`` (environment or ``.env``); these files are then left alone.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEYS_FILE = "api-keys"
FLOWER_FILE = "flower-password"


@dataclass(frozen=True)
class LocalSecrets:
    api_key: str | None  # None: the operator configured keys (not shown)
    flower_user: str
    flower_password: str


def ensure(
    run_dir: Path, keys_configured: bool, flower_user: str | None, flower_password: str | None
) -> LocalSecrets:
    """Generate what is missing (once), point the environment at it, say what to use."""
    api_key = None
    if not keys_configured:
        path = run_dir / KEYS_FILE
        if not path.exists():
            _write_private(path, f"{secrets.token_urlsafe(24)} tenant=local admin\n")
        api_key = path.read_text().split()[0]
        os.environ["VLMQ_API_KEYS_FILE"] = str(path)
    if not (flower_user and flower_password):
        path = run_dir / FLOWER_FILE
        if not path.exists():
            _write_private(path, secrets.token_urlsafe(18) + "\n")
        flower_user, flower_password = "vlmq", path.read_text().strip()
    return LocalSecrets(api_key, flower_user, flower_password)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(text)
