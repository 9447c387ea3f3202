"""Child processes for tests: own process group, log file, kill/restart for fault tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scripts.pdeathsig import term_with_parent

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ManagedProcess:
    """One command run in its own session (process group) with stdout+stderr to ``log_path``."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[ManagedProcess], bool] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115  (owned by the child)
        log.write(f"\n===== start #{self.starts}: {' '.join(self.cmd)}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log()[-4000:]}")
            if self.ready is None or self.ready(self):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log()[-4000:]}")

    def signal(self, sig: int = signal.SIGTERM, group: bool = True) -> None:
        """Send ``sig`` to the whole process group (default) or the leader only."""
        if not self.alive():
            return
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the group, wait bounded, then SIGKILL it."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        if self.wait(timeout_s) is None:
            self.signal(signal.SIGKILL)
            self.wait(5.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # stragglers (celery pool children)
            os.killpg(self.pid, signal.SIGKILL)


def log_contains(text: str) -> Callable[[ManagedProcess], bool]:
    return lambda proc: text in proc.log().rsplit("===== start #", 1)[-1]
