"""`make up` as a process the chaos test drives: its supervised children found by command line,
SIGKILLed on demand; a Redis with an append-only file that the test restarts in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from scripts.redis_launcher import RedisServer, free_port, start_redis

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    try:
        return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class PersistentRedis:
    """redis-server with an append-only file; ``restart()`` stops it and starts it on the same port
    and directory, as an operator's restart would."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server: RedisServer = start_redis(data_dir=data_dir)
        self.port = self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def restart(self) -> None:
        self.server.stop()  # SIGTERM: the append-only file is flushed
        self.server = start_redis(port=self.port, data_dir=self.data_dir)

    def stop(self) -> None:
        self.server.stop()


class UpProcess:
    """``python -m scripts.up`` (what `make up` runs) with its own ports, key prefix and run dir."""

    def __init__(self, redis_url: str, run_dir: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.run_dir = run_dir
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLMQ_")}
        full_env.update(env)
        full_env.update(
            {
                "VLMQ_REDIS_URL": redis_url,
                "VLMQ_PORT": str(self.port),
                "VLMQ_FLOWER_PORT": str(free_port()),
                "VLMQ_RUN_DIR": str(run_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.log = open(run_dir / "up.log", "wb")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scripts.up"],
            cwd=ROOT,
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"make up exited: {self.output()[-3000:]}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"make up not ready in {timeout_s}s: {self.output()[-3000:]}")

    @property
    def api_key(self) -> str:
        """The key `make up` generated for this run (it prints it too)."""
        return (self.run_dir / "api-keys").read_text().split()[0]

    def pid_of(self, kind: str) -> int:
        """The live pid of a supervised process: inference, decode (Celery main), decode-child, gateway."""
        marks = {
            "inference": "services.inference_worker",
            "decode": "worker.celery_app worker -Q decode ",  # the interactive node, not decode-batch
            "gateway": "-m gateway",
        }
        if kind == "decode-child":
            pool = children(self.pid_of("decode"))
            if not pool:
                raise LookupError("the decode worker has no pool child right now")
            return pool[0]
        found = [p for p in children(self.process.pid) if marks[kind] in cmdline(p)]
        if not found:
            raise LookupError(f"no live {kind} process")
        return found[0]

    def kill(self, kind: str, timeout_s: float = 60.0) -> int:
        """SIGKILL one process of ``kind`` (retrying while it is being restarted); returns its pid."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid = self.pid_of(kind)
                os.kill(pid, signal.SIGKILL)
                return pid
            except (LookupError, ProcessLookupError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.run_dir / "up.log").read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
