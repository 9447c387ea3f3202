"""Compose's one-shot `secrets` step: every secret the stack needs, in the shared volume.

A secret given in the environment (``.env`` or the shell) is written as given, so the operator's
value always wins; otherwise the one already in the volume is kept; otherwise a new one is
generated and printed once, here, in this container's log (`docker compose logs secrets`).
`docker compose down -v` drops the volume, and the next `up` generates new ones.

Files (all 0600, owned by the image's user, read by `docker/with_secrets.sh`):
  redis-password    the Redis password (letters and digits: it goes into a URL)
  api-keys          a keys file (VLMQ_API_KEYS_FILE): an admin key of tenant ``default``
  flower-user, flower-password
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

DIR = Path(os.environ.get("VLMQ_SECRETS_DIR", "/run/vlmq-secrets"))


def given(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def ensure(file: str, value: str | None, generate: str) -> tuple[str, bool]:
    """The secret's value, and whether it was generated just now."""
    path = DIR / file
    if value is None and path.exists():
        return path.read_text().strip(), False
    generated = value is None
    text = generate if value is None else value
    path.touch(mode=0o600)
    path.write_text(text + "\n")
    return text, generated


def main() -> int:
    made: list[str] = []
    redis_password, new = ensure("redis-password", given("VLMQ_REDIS_PASSWORD"), secrets.token_hex(24))
    made += ["  Redis password:  " + redis_password] if new else []
    if given("VLMQ_API_KEYS") is None and given("VLMQ_API_KEYS_FILE") is None:
        line, new = ensure("api-keys", None, f"{secrets.token_urlsafe(24)} tenant=default admin")
        made += ["  API key:         " + line.split()[0]] if new else []  # last: awk '{print $NF}'
    user, _ = ensure("flower-user", given("VLMQ_FLOWER_USER"), "vlmq")
    password, new = ensure("flower-password", given("VLMQ_FLOWER_PASSWORD"), secrets.token_urlsafe(18))
    made += [f"  Flower:          user {user}, password {password}"] if new else []
    if made:
        print("vlmq generated these secrets (kept in the volume; README 'Secrets' sets your own):")
        print("\n".join(made), flush=True)
        print("Send the key as `Authorization: Bearer KEY`.", flush=True)
    else:
        print("vlmq secrets: all present (given or kept from an earlier run)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
