"""Holds the engine's batch-priority work while interactive jobs are in flight anywhere.

The gateway adds every interactive job to ``Keys.interactive_jobs`` when it admits it (scored by
when its hold ends, ``VLMQ_BATCH_HOLD_S``); its terminal write removes it. An interactive job
spends most of its life outside the engine (queue, image decode, hand-over, the client's read);
batch work that runs meanwhile takes the CPU those stages need (a 2-core machine: 2-3x the
interactive latency under a batch flood). So, while its engine has batch work, the worker looks
every ``POLL_S`` and holds that work while the set holds a live entry and
``VLMQ_BATCH_HOLD_LINGER_S`` after (a client's next request follows its answer: batch work resumed
in that gap would finish together and flood the gateway with its clients' next submissions just as
it arrives). Batch work runs on what interactive work leaves idle, still bounded by aging. On a
Redis error the hold is released (an outage never stops batch work). Without batch work the thread
sleeps until some is submitted (``Engine.wait_for_batch_work``): a worker serving interactive work
only does not wake it 200 times a second (~0.2 CPU-ms a request at 32 clients, bench/README.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from shared.keys import Keys

log = logging.getLogger(__name__)
POLL_S = 0.005  # an interactive job's stages take milliseconds: look that often (one ZCOUNT each)
IDLE_WAIT_S = 0.25  # no batch work: wait this long for some at most (then look whether to stop)


class BatchHold:
    def __init__(self, client: Any, keys: Keys, engine: Any, linger_s: float) -> None:
        self.r = client
        self.linger_s = linger_s
        self.key = keys.interactive_jobs()
        self.engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-hold", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop looking and release the hold (a draining engine must finish its batch work)."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.engine.hold_batch(False)

    def interactive_in_flight(self) -> bool:
        return int(self.r.zcount(self.key, f"({time.time()!r}", "+inf")) > 0

    def _run(self) -> None:
        last_seen = float("-inf")
        while not self._stop.is_set():
            if not self.engine.wait_for_batch_work(IDLE_WAIT_S):  # nothing to hold: no Redis call
                self.engine.hold_batch(False)
                continue
            try:
                if self.interactive_in_flight():
                    last_seen = time.monotonic()
                held = time.monotonic() - last_seen < self.linger_s
            except redis.RedisError as exc:
                log.debug("batch hold: %s; batch work runs", exc)
                held, last_seen = False, float("-inf")
                self._stop.wait(0.5)
            self.engine.hold_batch(held)
            self._stop.wait(POLL_S)
