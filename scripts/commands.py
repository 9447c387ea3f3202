"""The command lines of vlmq's processes, shared by `make up` and the test/bench stacks."""

from __future__ import annotations

import sys

from shared.decode_task import BATCH_QUEUE, DECODE_QUEUE, QUEUES

PY = sys.executable
BATCH_NICE = 10  # the batch decode nodes' niceness (a lower CPU priority; no privilege needed)


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
    concurrency: int | str, log_level: str, node: str, *extra: str, events: bool = True, role: str = "all"
) -> list[str]:
    """Celery prefork decode workers; ``events``: task events on (``-E``), for Flower (off where no
    Flower runs: the test and bench stacks; the worker's heartbeat events, read by monitors only, are
    then off too: 9 % of the main process's py-spy samples at 32 clients). ``role``: ``all`` takes
    the interactive then the batch queue; ``interactive`` only the first; ``batch`` only the second,
    at a lower CPU priority (nice BATCH_NICE): on a busy machine batch decoding then yields the cores
    to interactive work."""
    queues = {"all": QUEUES, "interactive": (DECODE_QUEUE,), "batch": (BATCH_QUEUE,)}[role]
    niced = ["nice", "-n", str(BATCH_NICE)] if role == "batch" else []
    return [
        *niced, PY, "-m", "celery", "-A", "worker.celery_app", "worker", "-Q", ",".join(queues),
        "-c", str(concurrency), *(["-E"] if events else ["--without-heartbeat"]), "--loglevel", log_level,
        "-n", node, *extra,
    ]  # fmt: skip
