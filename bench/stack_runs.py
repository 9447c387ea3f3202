"""One measurement against the whole stack (no peer) on its own Redis: what the request-cost and
turns benches share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bench.resources import Meter
from scripts.redis_launcher import start_redis
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
