"""The startup heap frozen out of the garbage collector's walks, in a fresh interpreter (freezing is for
the whole process: never this test run's). The stack's processes: tests/service/test_startup_heap.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import gc, json, sys
from shared.heap import freeze_startup_heap

class Node:
    def __init__(self):
        self.me = self

startup = [Node() for _ in range(1000)]  # lives on: frozen
Node()  # a cycle already garbage: collected before the freeze, not frozen
returned = freeze_startup_heap("probe", enabled=sys.argv[1] == "on")
frozen = gc.get_freeze_count()
tracked_young = sum(len(gc.get_objects(generation=g)) for g in range(3))
Node()  # garbage made after the freeze: the collector still finds it
collected_after = gc.collect()
print(json.dumps({"returned": returned, "frozen": frozen, "young": tracked_young,
                  "collected_after": collected_after}))
"""


def probe(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_freezing_moves_the_startup_heap_out_of_every_generation() -> None:
    result = probe("on")
    assert result["returned"] == result["frozen"] > 1000  # the interpreter's own objects and ours
    assert result["young"] < 100  # nothing left for a collection to walk but what came after
    assert result["collected_after"] >= 1  # the cycle made later is freed


def test_disabled_freezes_nothing() -> None:
    result = probe("off")
    assert result["returned"] == result["frozen"] == 0
    assert result["young"] > 1000
