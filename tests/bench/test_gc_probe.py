"""The garbage-collection probe behind the bench's GC figures: a process started with it records its
collections, and ``bench.gc_report`` sums them by generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = "import gc\nfor _ in range(3):\n    gc.collect()\n"


def test_probe_records_each_collection_and_the_report_sums_them(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench" / "gc_probe"), "VLMQ_GC_PROBE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WORK], cwd=ROOT, env=env, check=True)
    (record_file,) = tmp_path.glob("*.json")
    events = json.loads(record_file.read_text())["events"]
    assert [gen for _, gen, _ in events].count(2) == 3  # each gc.collect() is a full collection
    report = subprocess.run(
        [sys.executable, "-m", "bench.gc_report", str(tmp_path), "--after", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "gen2 3 (" in report and "longest" in report
