"""`make test-compose`: the real docker-compose.yml, built and run under a project of its own.

Outside ``tests/`` on purpose: ``make test`` stays Docker-free. No Docker engine with Compose v2
is a failure with a message, never a skip. Every run has its own project name (``-p``), free
host ports, a random Redis password and no ``.env`` (``compose.test.yml``), so it never meets a
developer's stack or settings; ``docker compose down -v`` removes everything but the image.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import redis

from scripts.redis_launcher import free_port
from shared.keys import Keys

ROOT = Path(__file__).resolve().parents[1]
FILES = (ROOT / "docker-compose.yml", Path(__file__).with_name("compose.test.yml"))
BUILD_TIMEOUT_S = 480
UP_TIMEOUT_S = 240
TIMINGS: dict[str, float] = {}  # printed at the end of the run (terminal summary)
NOTES: dict[str, str] = {}  # what the tests saw, printed with the timings
SETUP_HINT = "on the build machines: `bash ../shared/docker/setup.sh` (root, idempotent)"


def run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def require_compose_v2() -> None:
    """Fail the run (not skip) unless `docker` reaches an engine and has the Compose v2 plugin."""
    problems = []
    try:
        version = run(["docker", "compose", "version", "--short"])
        if version.returncode != 0 or not version.stdout.strip().lstrip("v").startswith("2"):
            problems.append(f"no Compose v2 plugin ({(version.stdout + version.stderr).strip()})")
        info = run(["docker", "info", "--format", "{{.ServerVersion}}"])
        if info.returncode != 0:
            problems.append(f"no Docker engine ({' '.join(info.stderr.split())[:300]})")
    except FileNotFoundError:
        problems.append("no `docker` command")
    if problems:
        pytest.exit(f"make test-compose needs Docker with Compose v2: {'; '.join(problems)}; {SETUP_HINT}", 1)


@dataclass
class ComposeStack:
    """One compose project: `compose(...)` runs `docker compose` on it."""

    project: str = field(default_factory=lambda: f"vlmqtest-{secrets.token_hex(4)}")
    gateway_port: int = field(default_factory=free_port)
    flower_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    redis_password: str = field(default_factory=lambda: secrets.token_hex(16))
    flower_auth: tuple[str, str] = ("vlmqtest", secrets.token_hex(8))
    keys: Keys = field(default_factory=lambda: Keys("vlmq"))

    @property
    def env(self) -> dict[str, str]:
        """The shell environment of `docker compose`: nothing of the developer's VLMQ_*/COMPOSE_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLMQ_", "COMPOSE_"))}
        env.update(
            VLMQ_HOST="127.0.0.1",
            VLMQ_PORT=str(self.gateway_port),
            VLMQ_FLOWER_PORT=str(self.flower_port),
            VLMQ_TEST_REDIS_PORT=str(self.redis_port),
            VLMQ_REDIS_PASSWORD=self.redis_password,
            VLMQ_FLOWER_USER=self.flower_auth[0],
            VLMQ_FLOWER_PASSWORD=self.flower_auth[1],
        )
        return env

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        files = [a for f in FILES for a in ("-f", str(f))]
        # --env-file /dev/null: interpolation never reads the developer's .env either
        cmd = ["docker", "compose", "-p", self.project, "--env-file", os.devnull, *files, *args]
        done = run(cmd, env=self.env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[2:])} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return done.stdout

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def inspect(self, container: str, fmt: str) -> str:
        return run(["docker", "inspect", "-f", fmt, container]).stdout.strip()

    def logs(self, tail: int = 150) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), timeout=60, check=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}"

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.flower_port}"

    @cached_property
    def redis(self) -> Any:  # Any: redis-py's unions get in the way in tests
        return redis.Redis(host="127.0.0.1", port=self.redis_port, password=self.redis_password)


def note(name: str, text: str) -> None:
    NOTES[name] = text


def timed(name: str, stack: ComposeStack, *args: str, timeout: float) -> None:
    started = time.monotonic()
    stack.compose(*args, timeout=timeout)
    TIMINGS[name] = time.monotonic() - started


@pytest.fixture(scope="session")
def stack() -> Iterator[ComposeStack]:
    """The whole compose stack, built and healthy (`up --wait`); `down -v` at the end."""
    require_compose_v2()
    stack = ComposeStack()
    TIMINGS["session start"] = time.monotonic()
    try:
        timed("build", stack, "build", timeout=BUILD_TIMEOUT_S)
        timed("up to healthy", stack, "up", "-d", "--wait", "--no-build", timeout=UP_TIMEOUT_S)
        yield stack
    finally:
        started = time.monotonic()
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=120, check=False)
        TIMINGS["down -v"] = time.monotonic() - started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the containers' logs to a failing test's report."""
    outcome: Any = yield
    report = outcome.get_result()
    found = getattr(item, "funcargs", {}).get("stack")
    if report.failed and isinstance(found, ComposeStack):
        report.sections.append(("docker compose logs", found.logs()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    started = TIMINGS.pop("session start", None)
    if started is None:
        return
    TIMINGS["whole run (pytest session)"] = time.monotonic() - started
    lines = [f"  {name}: {seconds:.1f} s" for name, seconds in TIMINGS.items()]
    lines += [f"  {name}: {text}" for name, text in NOTES.items()]
    terminalreporter.write_sep("-", "compose timings")
    terminalreporter.write_line("\n".join(lines))
