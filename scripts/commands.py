"""The command lines of vlmq's processes, shared by `make up` and the test/bench stacks."""

from __future__ import annotations

import sys

from shared.decode_task import QUEUES

PY = sys.executable


def gateway_command() -> list[str]:
    """Host, port and log level come from VLMQ_HOST / VLMQ_PORT / VLMQ_LOG_LEVEL (gateway/__main__.py)."""
    return [PY, "-m", "gateway"]


def inference_command() -> list[str]:
    return [PY, "-m", "services.inference_worker"]


def flower_command(port: int, user: str, password: str) -> list[str]:
    """Flower on the loopback, behind basic auth (its API too: never open)."""
    return [
        PY, "-m", "celery", "-A", "worker.celery_app", "flower",
        f"--port={port}", "--address=127.0.0.1", f"--basic-auth={user}:{password}",
    ]  # fmt: skip


def decode_command(
    concurrency: int | str, log_level: str, node: str, *extra: str, events: bool = True
) -> list[str]:
    """Celery prefork decode workers on the interactive then the batch queue; ``events``: task
    events on (``-E``), for Flower (off where no Flower runs: the test and bench stacks)."""
    return [
        PY, "-m", "celery", "-A", "worker.celery_app", "worker", "-Q", ",".join(QUEUES),
        "-c", str(concurrency), *(["-E"] if events else []), "--loglevel", log_level, "-n", node, *extra,
    ]  # fmt: skip
