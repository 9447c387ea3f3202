"""One measurement against the whole stack (no peer) on its own Redis: what the request-cost and
turns benches share."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bench.resources import Meter
from scripts.redis_launcher import start_redis
from tests.support.models import test_model_path
from tests.support.stack import ALL, ServiceStack

T = TypeVar("T")
Measure = Callable[[ServiceStack], Coroutine[Any, Any, T]]


def on_stack(extra_env: dict[str, str], logs: Path, measure: Measure[T]) -> T:
    """Start Redis and every stack process, run ``measure`` on them, stop everything."""
    redis_server = start_redis()
    stack = ServiceStack(redis_server.url, logs, extra_env=extra_env, components=ALL)
    try:
        stack.start()
        return asyncio.run(measure(stack))
    finally:
        stack.stop()
        redis_server.stop()


def stack_meter(stack: ServiceStack) -> Meter:
    """CPU per process kind of the stack (and Redis), for readings around a phase."""
    return Meter(stack.redis, stack.keys, {name: proc.pid for name, proc in stack.procs.items()})


def add_stack_options(parser: argparse.ArgumentParser) -> None:
    """The options every stack bench takes: the model, torch threads, where results go, settings."""
    parser.add_argument("--model", default=str(test_model_path()))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--env", action="append", default=[], metavar="VLMQ_NAME=VALUE")


def report_fields(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """What every stack bench's result starts with: when, which mode, the settings, the logs."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return {"when": when, "mode": args.mode, "stack_env": args.env, "logs": str(logs)}
