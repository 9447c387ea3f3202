"""Run long-lived child processes, each in its own process group, restarting the ones that die.

``Supervisor.supervise()`` (called every half second by `make up`) notices a child that exited,
says so with its exit status and its last output lines, and starts it again after a backoff
(1 s, doubling while it keeps dying within ``STABLE_AFTER_S`` of its start, at most
``MAX_BACKOFF_S``), so a worker that cannot start (bad model path, no Redis) is reported and
retried instead of stopping the stack. ``on_restart`` hears of every restart (`make up` counts
them in ``/metrics``). ``stop()`` sends SIGTERM to every group (in reverse start order), waits a
bounded time, then SIGKILLs what is left: no orphaned Celery pool children or engine threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from scripts.pdeathsig import term_with_parent

STABLE_AFTER_S = 60.0  # a child that ran this long before dying starts again at the first backoff
MAX_BACKOFF_S = 30.0
TAIL_LINES = 5
EXIT_MEANINGS = {75: "engine unhealthy"}  # services/inference_worker: a distinct code to be restarted


@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's
    process: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES), repr=False)
    started_at: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0  # deaths in a row within STABLE_AFTER_S of a start
    restart_at: float | None = None  # set while a dead child waits for its restart

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(
        self,
        env: dict[str, str],
        cwd: Path,
        log_dir: Path,
        on_restart: Callable[[Child], None] | None = None,
    ) -> None:
        self.env = env
        self.cwd = cwd
        self.log_dir = log_dir
        self.on_restart = on_restart
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, cmd, dict(env or {}))
        self._spawn(child)
        self.children.append(child)
        return child

    def _spawn(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.cmd,
            cwd=self.cwd,
            env={**self.env, **child.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )
        child.started_at = time.monotonic()
        log = open(self.log_dir / f"{child.name}.log", "ab")  # noqa: SIM115  (closed by the pump)
        assert child.process.stdout is not None
        child.pump = threading.Thread(target=_pump, args=(child, child.process.stdout, log), daemon=True)
        child.pump.start()

    def supervise(self, now: float | None = None) -> None:
        """Notice children that died and restart those whose backoff is over."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            if child.alive():
                continue
            if child.restart_at is None:
                child.restart_at = now + self._backoff(child, now)
                _report_death(child, now)
            elif now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                self._spawn(child)
                print(f"[up] {child.name} restarted (restart #{child.restarts})", flush=True)
                if self.on_restart is not None:
                    self.on_restart(child)

    @staticmethod
    def _backoff(child: Child, now: float) -> float:
        child.quick_deaths = child.quick_deaths + 1 if now - child.started_at < STABLE_AFTER_S else 1
        return float(min(MAX_BACKOFF_S, 2 ** (child.quick_deaths - 1)))

    def stop(self, timeout_s: float = 30.0) -> None:
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


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    meaning = EXIT_MEANINGS.get(code)
    return f"exit code {code}" + (f": {meaning}" if meaning else "")


def _report_death(child: Child, now: float) -> None:
    assert child.process is not None and child.restart_at is not None
    ran, wait = now - child.started_at, child.restart_at - now
    last = " | ".join(line.strip() for line in child.tail) or "(no output)"
    print(
        f"[up] {child.name} died ({describe_exit(child.process.returncode)}) after {ran:.1f}s; "
        f"restarting in {wait:.0f}s. Last output: {last}",
        file=sys.stderr,
        flush=True,
    )


def _signal_group(child: Child, sig: int) -> None:
    if child.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)


def _pump(child: Child, stream: IO[bytes], log: IO[bytes]) -> None:
    prefix = f"{child.name:>11} | ".encode()
    with log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            child.tail.append(line.decode(errors="replace"))
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.buffer.flush()
