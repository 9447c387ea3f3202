"""The bench's per-process readings: ``/proc/<pid>/stat`` read at the right fields."""

from __future__ import annotations

import os
import resource

from bench.resources import CLOCK_TICKS, STACK, Reading, cost, process_usage


def test_process_usage_reads_this_process_as_getrusage_counts_it() -> None:
    cpu_s, faults = process_usage(os.getpid())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert abs(cpu_s - (usage.ru_utime + usage.ru_stime)) <= 2 / CLOCK_TICKS
    assert 0 < faults <= usage.ru_minflt <= faults + 64  # the reading's own allocations between
    assert process_usage(2**22 + 1) == (0.0, 0)  # no such process: zeros


def test_cost_counts_the_stack_outside_the_forward_without_the_load_generator_or_the_peer() -> None:
    before = Reading({k: 1.0 for k in (*STACK, "loadgen", "peer")}, 0, {"forward_cpu_s": 2.0})
    after = Reading(
        {"gateway": 1.2, "decode": 1.3, "inference": 2.0, "redis": 1.1, "loadgen": 9.0, "peer": 9.0},
        1000,
        {"forward_cpu_s": 2.5},
    )
    measured = cost(before, after, 10)  # per request: 20 + 30 + 100 + 10 ms, of which 50 ms forward
    assert round(measured["forward_cpu_ms"], 6) == 50.0
    assert round(measured["outside_forward_cpu_ms"], 6) == 110.0
