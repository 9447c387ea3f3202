"""The service stack for end-to-end tests: decode worker, inference worker, gateway.

Real subprocesses against the test Redis, each in its own process group with a log file.
``ServiceStack.kill(name, sig)`` and ``restart(name)`` drive fault tests; ``logs()`` is printed
when a test fails.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from celery import Celery

from scripts.commands import decode_command, gateway_command, inference_command
from scripts.redis_launcher import free_port
from shared import workers
from shared.config import DecodeWorkerSettings, GatewaySettings
from shared.decode_task import DECODE_QUEUE, DECODE_TASK, make_celery_app
from shared.keys import Keys
from shared.redis_clients import sync_client
from tests.support.models import test_model_path
from tests.support.processes import ManagedProcess, log_contains

ALL = ("decode", "inference", "gateway")

# Short timings so fault tests run in seconds; any test may override through ``extra_env``.
TEST_ENV = {
    "VLMQ_HEARTBEAT_S": "0.5",
    "VLMQ_CLAIM_IDLE_MS": "3000",
    "VLMQ_MAX_DELIVERIES": "3",
    "VLMQ_VISIBILITY_TIMEOUT_S": "10",
    "VLMQ_WORKER_STALE_S": "3",
    "VLMQ_DECODE_CONCURRENCY": "1",
    "VLMQ_LOG_LEVEL": "INFO",
}


def base_env(redis_url: str, key_prefix: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every stack process: the parent's, minus stray VLMQ_*, plus the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLMQ_")}
    env.update(TEST_ENV)
    env.update(
        {
            "VLMQ_REDIS_URL": redis_url,
            "VLMQ_KEY_PREFIX": key_prefix,
            "VLMQ_MODEL": str(test_model_path()),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        }
    )
    env.update(extra_env or {})
    return env


class ServiceStack:
    """Handle on the running processes; attributes named in ``runs/READY-stack.txt``."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        extra_env: dict[str, str] | None = None,
        components: Iterable[str] = ALL,
        key_prefix: str | None = None,
        task_events: bool = False,
    ) -> None:
        """``task_events``: decode workers publish Celery task events (``-E``), as where Flower runs."""
        self.key_prefix = key_prefix or f"vlmqtest-{uuid.uuid4().hex[:8]}"
        self.env = base_env(redis_url, self.key_prefix, extra_env)
        self.task_events = task_events or self.env.get("VLMQ_TASK_EVENTS") == "true"  # Flower runs: both
        self.settings = GatewaySettings.model_validate(_settings_kwargs(self.env))  # exactly the stack's env
        self.keys: Keys = self.settings.keys
        self.redis: Any = sync_client(redis_url, sentinel=self.settings.sentinel)  # Any: redis-py's unions
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.components = tuple(components)
        self.procs: dict[str, ManagedProcess] = {n: self._make(n) for n in self.components}
        self._celery: Celery | None = None

    # --- process definitions ---
    def _make(self, name: str) -> ManagedProcess:
        """``decode``, ``inference``, ``gateway``; ``decode-2``, ``inference-2``... for more of a kind;
        ``decode-batch``: a node for batch-priority work only, niced (the ``decode`` nodes then take
        interactive work only, as `make up` runs them)."""
        log = self.log_dir / f"{name}.log"
        kind = name.split("-")[0]
        if kind == "decode":
            concurrency = self.env.get("VLMQ_DECODE_CONCURRENCY", "1")
            node = f"{name}-{self.key_prefix}@%h"
            extra = ("--without-mingle", "--without-gossip")
            role = "batch" if name.startswith("decode-batch") else "all"
            if role == "all" and any(n.startswith("decode-batch") for n in self.components):
                role = "interactive"  # batch work has its own (niced) node
            cmd = decode_command(concurrency, "INFO", node, *extra, events=self.task_events, role=role)
            return ManagedProcess(name, cmd, self.env, log, ready=log_contains("decode process ready"))
        if kind == "inference":
            env = {**self.env, "VLMQ_WORKER_ID": f"{name}-{self.key_prefix}"}
            ready = lambda _p: self.worker_alive(env["VLMQ_WORKER_ID"])  # noqa: E731
            return ManagedProcess(name, inference_command(), env, log, ready=ready)
        if name == "gateway":
            env = {**self.env, "VLMQ_HOST": "127.0.0.1", "VLMQ_PORT": str(self.port)}
            return ManagedProcess(name, gateway_command(), env, log, ready=lambda _p: self._healthz())
        raise ValueError(f"unknown component {name!r}")

    # --- readiness ---
    def _healthz(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def worker_alive(self, worker_id: str | None = None) -> bool:
        """An inference worker (this one, or any) of this stack's key space has a fresh heartbeat."""
        stale_s = float(self.env["VLMQ_WORKER_STALE_S"])
        beats = workers.live_sync(self.redis, self.keys, stale_s, time.time())
        return any(worker_id in (None, b.get("worker_id")) for b in beats)

    # --- talking to the decode workers like the gateway does ---
    def celery_app(self) -> Celery:
        """A Celery app with this stack's settings (broker, key prefix); made once."""
        if self._celery is None:
            settings = DecodeWorkerSettings.model_validate(_settings_kwargs(self.env))
            self._celery = make_celery_app(settings)
        return self._celery

    def no_decode_task_waiting(self, timeout_s: float = 10.0) -> None:
        """Every decode claim ended: no task holds a job or waits for the next (``VLMQ_DECODE_LINGER_S``),
        so the next job gets a Celery task of its own."""
        pattern = self.keys.decode_claim("*")

        def idle() -> bool:  # a task between its hand-over and its wait has no claim key yet: ask Celery too
            if list(self.redis.scan_iter(pattern)):
                return False
            active = self.celery_app().control.inspect(timeout=0.5).active() or {}
            return not any(active.values()) and not list(self.redis.scan_iter(pattern))

        wait_for(idle, timeout_s, what="no decode task waiting")

    def enqueue_decode(self, job_id: str) -> str:
        return str(self.celery_app().send_task(DECODE_TASK, args=[job_id], queue=DECODE_QUEUE).id)

    # --- lifecycle ---
    def start(self, timeout_s: float = 120.0) -> ServiceStack:
        for proc in self.procs.values():
            proc.start()
        for proc in self.procs.values():
            proc.wait_ready(timeout_s)
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL, group: bool = True) -> None:
        """Signal a component (whole process group by default) and wait for the leader to exit."""
        proc = self.procs[name]
        proc.signal(sig, group=group)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            proc.wait(30.0)

    def children(self, name: str) -> list[int]:
        """Child pids of a component's leader (the Celery pool processes of ``decode``)."""
        tasks = Path(f"/proc/{self.procs[name].pid}/task")
        return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]

    def restart(self, name: str, timeout_s: float = 120.0) -> None:
        proc = self.procs[name]
        if proc.alive():
            proc.stop()
        if name.startswith("inference"):  # the dead worker's heartbeat must not count as readiness
            pipe = self.redis.pipeline()
            workers.withdraw(pipe, self.keys, proc.env["VLMQ_WORKER_ID"])
            pipe.execute()
        proc.start()
        proc.wait_ready(timeout_s)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        if self._celery is not None:
            self._celery.close()
        self.redis.close()

    def logs(self, tail: int = 6000) -> str:
        return "\n".join(f"----- {n} ({p.log_path}) -----\n{p.log()[-tail:]}" for n, p in self.procs.items())

    def __enter__(self) -> ServiceStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _settings_kwargs(env: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("VLMQ_").lower(): v for k, v in env.items() if k.startswith("VLMQ_")}


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value (returned) or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not reached within {timeout_s}s")


@contextmanager
def running(stack: ServiceStack, timeout_s: float = 120.0) -> Iterator[ServiceStack]:
    """Start ``stack`` (printing its logs if it cannot start) and stop it on exit."""
    try:
        stack.start(timeout_s=timeout_s)
    except Exception:
        print(stack.logs())
        stack.stop()
        raise
    try:
        yield stack
    finally:
        stack.stop()
