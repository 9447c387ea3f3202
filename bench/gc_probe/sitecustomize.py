"""Records every garbage collection of a Python process: put this folder on ``PYTHONPATH`` (with
``VLMQ_GC_PROBE_DIR`` set to a folder) and every process started from it, the stack's and the
bench's, writes ``<pid>.json`` there: its command line and each collection's time since start,
generation and wall milliseconds. ``python -m bench.gc_report DIR`` sums them (bench/README.md)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from typing import Any

_OUT = os.environ.get("VLMQ_GC_PROBE_DIR")
_events: list[tuple[float, int, float]] = []
_state = {"began": 0.0, "written": 0.0, "pid": float(os.getpid()), "start": time.monotonic()}


def _record(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _state["began"] = time.perf_counter()
        return
    if os.getpid() != _state["pid"]:  # a forked child: its own record, and its life, from here
        _state["pid"] = float(os.getpid())
        _state["start"] = time.monotonic()
        _events.clear()
    took_ms = 1000 * (time.perf_counter() - _state["began"])
    _events.append((round(time.monotonic() - _state["start"], 3), int(info["generation"]), round(took_ms, 3)))
    if time.monotonic() - _state["written"] > 1.0:  # at most once a second: the probe stays cheap
        _state["written"] = time.monotonic()
        _write()


def _write() -> None:
    record = {"argv": sys.argv[:3], "life_s": time.monotonic() - _state["start"], "events": _events}
    with open(os.path.join(str(_OUT), f"{os.getpid()}.json"), "w") as f:
        json.dump(record, f)


if _OUT:
    gc.callbacks.append(_record)
    atexit.register(_write)  # the last second's collections too (a forked pool child skips this)
