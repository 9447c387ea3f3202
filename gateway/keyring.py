"""API keys and the tenants they name.

Keys come from ``VLMQ_API_KEYS`` (comma-separated; each key is a tenant of its own, named after
its hash) and from ``VLMQ_API_KEYS_FILE``, one key per line::

    <key> [tenant=NAME] [rpm=N] [tpm=N] [concurrency=N] [priority=interactive|batch] [admin]

Only SHA-256 digests of the keys are kept, and a presented key is compared with every one in
constant time. The file is read again when it changes (checked at most once a second) or on
SIGHUP, so keys rotate without a restart. No key configured at all: the gateway is open (a
development default, refused in production by the settings).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a tenant name goes into Redis keys
RECHECK_S = 1.0
Priority = Literal["interactive", "batch"]


@dataclass(frozen=True)
class Tenant:
    name: str
    rpm: int = 0  # requests per minute; 0: no limit
    tpm: int = 0  # tokens (requested max_tokens) per minute; 0: no limit
    concurrency: int = 0  # jobs in flight; 0: no limit
    priority: Priority = "interactive"  # its requests' default; a batch tenant cannot ask for more
    admin: bool = False  # may list and retry dead letters


class KeyFileError(ValueError):
    pass


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Keyring:
    def __init__(self, keys: str | None, keys_file: str | None) -> None:
        self._inline = {digest(k): Tenant(f"key-{digest(k).hex()[:8]}") for k in _split(keys)}
        self._file = Path(keys_file) if keys_file else None
        self._from_file: dict[bytes, Tenant] = {}
        self._mtime: float | None = None
        self._checked = 0.0
        self._reload_now = False
        self.reload()

    @property
    def enabled(self) -> bool:
        return bool(self._inline or self._file)

    def tenant(self, presented: str | None) -> Tenant | None:
        """The key's tenant, or None (unknown key). Every stored digest is compared."""
        self._maybe_reload()
        if not presented:
            return None
        wanted, found = digest(presented), None
        for stored, tenant in (*self._inline.items(), *self._from_file.items()):
            if hmac.compare_digest(stored, wanted):
                found = tenant
        return found

    def by_name(self, name: str) -> Tenant | None:
        """The tenant of that name as its key defines it now (quotas may have changed), if any."""
        self._maybe_reload()
        return next((t for t in (*self._inline.values(), *self._from_file.values()) if t.name == name), None)

    def reload(self) -> None:
        """Read the keys file again (a broken file keeps the previous keys, and says why)."""
        if self._file is None:
            return
        try:
            self._mtime = self._file.stat().st_mtime
            self._from_file = parse_keys_file(self._file.read_text())
        except (OSError, KeyFileError) as exc:
            log.error(
                "keys file %s not (re)loaded, keeping %d keys: %s", self._file, len(self._from_file), exc
            )
            return
        log.info("keys file %s: %d keys", self._file, len(self._from_file))

    def reload_on_sighup(self) -> None:
        signal.signal(signal.SIGHUP, lambda _sig, _frame: setattr(self, "_reload_now", True))

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if self._file is None or (not self._reload_now and now - self._checked < RECHECK_S):
            return
        self._checked, self._reload_now = now, False
        try:
            changed = os.stat(self._file).st_mtime != self._mtime
        except OSError:
            changed = False
        if changed:
            self.reload()


def _split(keys: str | None) -> list[str]:
    return [k.strip() for k in (keys or "").split(",") if k.strip()]


def parse_keys_file(text: str) -> dict[bytes, Tenant]:
    tenants: dict[bytes, Tenant] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if words:
            tenants[digest(words[0])] = _tenant(words[0], words[1:], number)
    return tenants


def _tenant(key: str, options: list[str], line: int) -> Tenant:
    values: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition("=")
        values[name] = value if value else "true"
    unknown = set(values) - {"tenant", "rpm", "tpm", "concurrency", "priority", "admin"}
    name = values.get("tenant", f"key-{digest(key).hex()[:8]}")
    priority = values.get("priority", "interactive")
    if unknown or not TENANT_PATTERN.match(name) or priority not in ("interactive", "batch"):
        raise KeyFileError(f"line {line}: unknown option {sorted(unknown)}, bad tenant name or priority")
    try:
        limits = {k: int(values.get(k, "0")) for k in ("rpm", "tpm", "concurrency")}
    except ValueError:
        raise KeyFileError(f"line {line}: rpm, tpm and concurrency are whole numbers") from None
    return Tenant(name, priority=priority, admin=values.get("admin") == "true", **limits)  # type: ignore[arg-type]
