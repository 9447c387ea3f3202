"""The bench's per-process readings: ``/proc/<pid>/stat`` read at the right fields."""

from __future__ import annotations

import os
import resource

from bench.resources import CLOCK_TICKS, process_usage


def test_process_usage_reads_this_process_as_getrusage_counts_it() -> None:
    cpu_s, faults = process_usage(os.getpid())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert abs(cpu_s - (usage.ru_utime + usage.ru_stime)) <= 2 / CLOCK_TICKS
    assert 0 < faults <= usage.ru_minflt <= faults + 64  # the reading's own allocations between
    assert process_usage(2**22 + 1) == (0.0, 0)  # no such process: zeros
