"""Keep Python's cyclic garbage collector off the heap a process built while starting.

A worker process that imported torch and transformers tracks ~425k objects that live as long as it
does (modules, classes, the model's parameters and buffers); the gateway ~94k. Every full collection
walks all of them with the GIL held: ~190 ms in the inference worker, where it came every ~10 s at
32 clients and stalled every running request (bench/README.md, issue 18). ``gc.freeze`` moves them
to a generation the collector never walks; collections then cost what the requests in flight
allocate. Objects frozen here are still freed when their last reference goes; a cycle among them
(and whatever it holds) would stay: a one-time loss (~10-30 objects a process measured), not one
that grows.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap(process: str, enabled: bool = True) -> int:
    """Collect what starting up left behind, then freeze the rest (``VLMQ_GC_FREEZE``); returns the
    objects frozen so far (a second call, say in a forked child, adds what was built since the first)."""
    if not enabled:
        return gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d startup objects frozen (the garbage collector skips them)", process, frozen)
    return frozen
