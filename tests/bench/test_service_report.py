"""The service benchmark's arithmetic: the p99 after the ramp, and the ratios over interleaved repeats."""

from __future__ import annotations

from typing import Any

from bench.service_report import fault_rows, head, latency_rows, ratios
from bench.service_workload import Sample, summarize


def samples(e2e: list[float]) -> list[Sample]:
    return [Sample(i, t, t / 2, "red") for i, t in enumerate(e2e)]


def test_p99_after_the_ramp_leaves_out_each_clients_first_request() -> None:
    # 4 clients: requests 0-3 are the burst they start with (slow), the rest the steady state
    summary = summarize(samples([9.0, 8.0, 7.0, 6.0, *[1.0] * 96, 2.0]), wall_s=10.0, ramp=4)
    assert summary["e2e_p99"] == 8.0  # the burst dominates the whole run's p99
    assert summary["e2e_p99_after_ramp"] == 2.0
    assert summarize(samples([3.0, 1.0]), wall_s=1.0)["e2e_p99_after_ramp"] == 3.0  # no ramp: all


def run(mode: str, repeat: int, qps: float, p99: float) -> dict[str, Any]:
    summary = {"qps": qps, "e2e_p50": 1.0, "e2e_p99": p99, "e2e_p99_after_ramp": p99 / 2, "ttft_p50": 0.5}
    summary |= {"requests": 10, "e2e_p90": 1.0, "ttft_p90": 0.5, "ttft_p99": 0.5}
    return {"mode": mode, "concurrency": 32, "repeat": repeat, "summary": summary}


def test_ratios_are_the_median_of_the_interleaved_repeats() -> None:
    runs = []
    for repeat, (peer_qps, ours_qps) in enumerate([(10, 30), (12, 24), (8, 32)], start=1):
        runs += [run("peer-openai", repeat, peer_qps, 2.0), run("vlmq-openai", repeat, ours_qps, 1.0)]
    result = {"levels": [32], "repeats": 3, "runs": runs}
    (row,) = ratios(result)
    assert [r["throughput"] for r in row["repeats"]] == [3.0, 2.0, 4.0]
    assert row["throughput"] == 3.0 and row["e2e_p99"] == 0.5 and row["e2e_p99_after_ramp"] == 0.5


def test_one_run_reports_its_own_ratios() -> None:
    result = {"levels": [32], "runs": [run("peer-openai", 1, 10, 2.0), run("vlmq-openai", 1, 25, 1.5)]}
    (row,) = ratios(result)
    assert row["throughput"] == 2.5 and row["e2e_p99"] == 0.75 and len(row["repeats"]) == 1


def test_the_report_names_each_repeat_and_brackets_their_ratios() -> None:
    runs = [run(m, k, q, 1.0) for k in (1, 2) for m, q in (("peer-openai", 10), ("vlmq-openai", 30))]
    result = {"levels": [32], "repeats": 2, "runs": runs, "stage_names": []}
    result |= {"when": "now", "machine": "here", "model": "m"}
    lines = head(result) + latency_rows(result)
    assert any(line.startswith("| vlmq-openai #2 | 32 |") for line in lines)
    assert any(line.startswith("- c=32: throughput 3.00x [3.00 3.00]") for line in lines)


def test_the_report_has_each_runs_page_faults_per_request_by_process() -> None:
    cost = {"minor_faults": {"gateway": 32.4, "decode": 1.6, "inference": 38.2, "loadgen": 0.0}}
    runs = [run("vlmq-openai", 1, 30, 1.0) | {"cost": cost}, run("peer-openai", 1, 10, 1.0)]
    lines = fault_rows({"levels": [32], "runs": runs})
    assert "| server | conc | gateway | decode | inference | loadgen | peer |" in lines
    assert "| vlmq-openai | 32 | 32 | 2 | 38 | 0 | - |" in lines
    assert not any(line.startswith("| peer-openai") for line in lines)  # a run without readings
    assert fault_rows({"levels": [32], "runs": [run("peer-openai", 1, 10, 1.0)]}) == []
