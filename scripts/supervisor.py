"""Run a few long-lived child processes, each in its own process group, with prefixed output.

``Supervisor.stop()`` sends SIGTERM to every group (in reverse start order), waits a bounded
time, then SIGKILLs what is left: no orphaned Celery pool children or engine threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from scripts.pdeathsig import term_with_parent


@dataclass
class Child:
    name: str
    cmd: list[str]
    process: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(self, env: dict[str, str], cwd: Path, log_dir: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.log_dir = log_dir
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, cmd: list[str]) -> Child:
        child = Child(name, cmd)
        child.process = subprocess.Popen(
            cmd,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115  (closed by the pump)
        assert child.process.stdout is not None
        child.pump = threading.Thread(target=_pump, args=(name, child.process.stdout, log), daemon=True)
        child.pump.start()
        self.children.append(child)
        return child

    def exited(self) -> Child | None:
        """The first child that is no longer running, if any."""
        return next((c for c in self.children if not c.alive()), None)

    def stop(self, timeout_s: float = 20.0) -> None:
        for child in reversed(self.children):
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in reversed(self.children):
            assert child.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.1, deadline - time.monotonic()))
        for child in self.children:
            if child.alive():
                print(f"[up] {child.name} did not stop in {timeout_s:.0f}s: SIGKILL", file=sys.stderr)
            _signal_group(child, signal.SIGKILL)  # stragglers in the group too
            assert child.process is not None
            child.process.wait()


def _signal_group(child: Child, sig: int) -> None:
    if child.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)


def _pump(name: str, stream: IO[bytes], log: IO[bytes]) -> None:
    prefix = f"{name:>9} | ".encode()
    with log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.buffer.flush()
