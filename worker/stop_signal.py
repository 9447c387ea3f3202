"""A pool child's SIGTERM ends its task's wait for the next job (``worker.claims``), not the child.

A prefork child dies on SIGTERM (billiard's handler exits it): a child killed while it runs a task
is replaced, and the task, rejected on worker lost, runs again. That is right while a job decodes,
but a task waiting in ``BLMOVE`` has nothing in progress: a SIGTERM sent to every process of the
worker (``make up``'s stop, the test stacks, systemd's control-group kill; Docker and Kubernetes
signal the main process only) would log a WorkerLostError for it and leave its message requeued.
Here the wait ends instead: the task gives its claim back and returns, the child claims no more,
and the main process's warm shutdown ends it as an idle child. Outside a wait, billiard's own
handler runs. Installed at a pool child's first wait: billiard sets its handler after
``worker_process_init``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class WaitStopped(Exception):
    """SIGTERM came while the task waited for a job."""


class _State:
    pool_child = False  # set by worker_process_init: never Celery's main process (its own shutdown)
    previous: Callable[[int, FrameType | None], Any] | int | None = None
    installed = False
    waiting = False
    stopping = False  # SIGTERM came: no more claims in this child


def mark_pool_child() -> None:
    _State.pool_child = True


def stopping() -> bool:
    return _State.stopping


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The block (a blocking wait) ends with WaitStopped on SIGTERM, in a prefork pool child."""
    if _State.stopping:
        raise WaitStopped()
    if _State.pool_child and not _State.installed:
        _State.previous = signal.signal(signal.SIGTERM, _on_sigterm)
        _State.installed = True
    _State.waiting = True
    try:
        yield
    finally:
        _State.waiting = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _State.stopping = True
    if _State.waiting:
        _State.waiting = False
        raise WaitStopped()
    previous = _State.previous
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)  # the default action, as if no handler were here
    os.kill(os.getpid(), signum)
