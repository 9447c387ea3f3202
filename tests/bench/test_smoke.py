"""Every benchmark runs, end to end, in its smoke mode (seconds, tiny counts): no benchmark can rot
unnoticed. The figures of a smoke run measure nothing; only that each code path ran is checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.slow


def run_bench(module: str, out: Path, *extra: str, timeout_s: float = 240) -> dict[str, Any]:
    """``python -m <module> --smoke --out <out> [extra]`` as ``make bench`` runs it; its JSON result."""
    cmd = [sys.executable, "-m", module, "--smoke", "--out", str(out), *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{module} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (found,) = out.glob("*_smoke.json")
    return dict(json.loads(found.read_text()))


def test_engine_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.engine_bench", tmp_path)
    assert result["meta"]["mode"] == "smoke"
    for model in ("bundled", "large"):
        r = result[model]
        assert set(r["quantization"]) == {"none", "bf16", "int8", "int4"}
        for workload in r["throughput"].values():
            for rows in workload.values():
                assert [row["clients"] for row in rows] == [1, 8]
        for section in ("prefix_ttft", "session_turn2", "image_ttft", "efficiency"):
            assert r[section]
    assert (tmp_path / "engine_bench_smoke.png").exists()


def test_service_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.service_bench", tmp_path, "--repeats", "2")
    runs = [(r["mode"], r["concurrency"], r["repeat"]) for r in result["runs"]]
    modes = ("peer-openai", "vlmq-openai", "vlmq-ws")
    assert runs == [(m, c, k) for c in (1, 2) for k in (1, 2) for m in modes]  # interleaved
    seeds = {(r["mode"], r["concurrency"], r["repeat"]): r["seed"] for r in result["runs"]}
    for c in (1, 2):  # the peer and vlmq-openai: the same pictures; a repeat: new ones
        assert seeds["peer-openai", c, 1] == seeds["vlmq-openai", c, 1] != seeds["vlmq-openai", c, 2]
        assert len({seeds[m, c, k] for m in ("vlmq-openai", "vlmq-ws") for k in (1, 2)}) == 4
    assert all(r["summary"]["errors"] == 0 for r in result["runs"])
    assert result["overhead"]["overhead_p50"] is not None
    assert result["engine_agreement"]["identical"] == result["engine_agreement"]["compared"]
    for run in result["runs"]:  # CPU per process kind, the forward's share, Redis growth
        assert set(run["cost"]["cpu_ms"]) == {"gateway", "decode", "inference", "redis", "loadgen", "peer"}
        assert "forward_cpu_ms" in run["cost"] and "redis_bytes_per_job" in run["cost"]
    assert result["memory"]["jobs"] > 0 and result["memory"]["by_kind"]
    report = (tmp_path / "service_bench_smoke.md").read_text()
    assert "the median of 2 interleaved runs" in report and "vlmq-openai #2" in report


def test_decode_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.decode_bench", tmp_path)
    assert [row["setting"] for row in result["rows"]] == ["full decode", "oversample 1.41", "oversample 1.0"]
    for row in result["rows"]:
        assert row["cpu_ms"]["median"] > 0 and 0 <= row["same_as_full"] <= result["requests"]
    assert result["rows"][0]["same_as_full"] == result["requests"]  # the full decode against itself
    assert (tmp_path / "decode_bench_smoke.md").exists()


def test_gpu_bench_smoke_on_cpu(tmp_path: Path) -> None:
    """The CUDA benchmark's script, on CPU with a tiny random GLM-4V: both servers answer with
    exactly max_tokens tokens (the script exits 1 otherwise)."""
    result = run_bench("bench.gpu_bench", tmp_path)
    assert result["device"] == "cpu"
    assert {(r["server"], r["concurrency"]) for r in result["rows"]} == {
        (s, c) for s in ("transformers-serve", "vlmq") for c in (1, 2)
    }
    assert all(r["not_max_tokens"] == [] and r["errors"] == 0 for r in result["rows"])
    assert all(r["slowest_ttft"] and r["slowest_ttft"][0]["ttft"] > 0 for r in result["rows"])
    vlmq = [r["cpu"] for r in result["rows"] if r["server"] == "vlmq"]
    assert all(cpu["forward"] > 0 and cpu["inference"] > 0 for cpu in vlmq)  # the forward's CPU is read


def test_gpu_exactness_smoke_on_cpu(tmp_path: Path) -> None:
    """The CUDA exactness check's script, on CPU: batched, prefix-cached answers equal generate."""
    result = run_bench("bench.gpu_exactness", tmp_path)
    (mode,) = result["results"]
    assert mode["matched"] == mode["requests"] == 3 and mode["largest_batch"] == 3
    assert mode["pictures_on_device"] == mode["pixels_equal"] == 1  # one picture finished from uint8
    assert mode["largest_prefill"] == 3  # ... prefilled with the others: encoded beside a fresh picture


def test_priority_bench_smoke(tmp_path: Path) -> None:
    """A stack with the niced batch decode node and the batch hold, both floods, every job done."""
    result = run_bench("bench.priority_bench", tmp_path)
    assert result["mode"] == "smoke" and result["unloaded_web_p50_s"] > 0
    for phase in ("under_batch_flood", "under_interactive_flood"):
        flood = result[phase]
        assert flood["flood_jobs"] > 0 and flood["flood_done"] == flood["flood_jobs"]
        assert flood["ratio_to_unloaded"] > 0 and flood["web_stage_medians_s"]["total"] is not None


def test_request_cost_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.request_cost", tmp_path, timeout_s=120)
    assert len(result["rows"]) == 7
    for row in result["rows"]:  # CPU per process kind for every kind of request (10 ms ticks: may be 0)
        assert {"gateway", "decode", "inference", "redis", "loadgen"} <= set(row["cpu_ms"])
    assert sum(row["cpu_ms"]["gateway"] for row in result["rows"]) > 0
    assert result["rows"][-1]["forward_cpu_ms"] > 0  # 128 tokens a request: the forward's counters move
    for row in result["rows"][1:]:  # every accepted request wrote its job: Redis commands counted
        assert row["redis_commands"] > 0 and row["top_commands"]
    for row in result["rows"][3:]:  # a new picture every request: each one decoded, none held
        assert row["decodes"] == 1, row
    assert (tmp_path / "request_cost_smoke.md").exists()


def test_turns_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.turns_bench", tmp_path, timeout_s=120)
    assert list(result["runs"]) == ["skip decoding", "decode every turn"]
    for rows in result["runs"].values():
        kinds = [(row["turn"], row["kind"]) for row in rows]
        assert kinds == [(1, "picture"), (2, "text follow-up"), (3, "picture sent again")]
        for row in rows:  # every conversation answered each turn; stage times and CPU recorded
            assert row["answered"] == result["conversations"]
            assert row["e2e_ms"] > 0 and set(row["stages_ms"]) >= {"queue", "decode", "wait", "vision"}
            assert {"gateway", "decode", "inference", "redis"} <= set(row["cpu_ms"])
        assert rows[1]["stages_ms"]["vision"] == 0  # the follow-up's picture came from the session's caches
    for turn in (1, 2):  # the follow-up and the picture sent again went straight to their worker
        skipped, decoded = (rows[turn]["stages_ms"]["decode"] for rows in result["runs"].values())
        assert skipped == 0 < decoded, turn  # in the first stack only
    assert set(result["follow_ups"]) == set(result["runs"])
    assert (tmp_path / "turns_bench_smoke.md").exists()


def test_redis_parser_bench_smoke(tmp_path: Path) -> None:
    result = run_bench("bench.redis_parser_bench", tmp_path, timeout_s=60)
    for row in result["cpu_us"].values():
        assert set(row) == {"python", "hiredis"} and all(us > 0 for us in row.values())
