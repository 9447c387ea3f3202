"""Batch-priority decoding on its own niced node, as `make up` runs it: interactive jobs are decoded
by the ``decode`` node, batch jobs by ``decode-batch`` at a lower CPU priority, and both finish."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from scripts.commands import BATCH_NICE
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

KEYS = "key-web tenant=web\nkey-bulk tenant=bulk priority=batch\n"
JPEG = image_bytes("JPEG", (96, 96), seed=3)


def run_job(stack: ServiceStack, key: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    files = {"image": ("a.jpg", JPEG, "image/jpeg")}
    data = {"prompt": "What colour is the circle?", "max_tokens": "4"}
    resp = httpx.post(f"{stack.base_url}/v1/jobs", data=data, files=files, headers=headers)
    job_id = str(resp.json()["id"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = httpx.get(f"{stack.base_url}/v1/jobs/{job_id}", headers=headers).json()
        if view["status"] in ("done", "failed", "cancelled"):
            assert view["status"] == "done", view
            return job_id
        time.sleep(0.05)
    raise TimeoutError(job_id)


def test_batch_jobs_are_decoded_by_the_niced_node(
    stack_factory: Callable[..., ServiceStack], tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    stack = stack_factory(
        components=("decode", "decode-batch", "inference", "gateway"),
        extra_env={"VLMQ_API_KEYS_FILE": str(tmp_path / "keys")},
    )
    interactive, batch = run_job(stack, "key-web"), run_job(stack, "key-bulk")
    logs = {name: stack.procs[name].log_path.read_text() for name in ("decode", "decode-batch")}
    assert interactive in logs["decode"] and interactive not in logs["decode-batch"]
    assert batch in logs["decode-batch"] and batch not in logs["decode"]
    for name, niceness in (("decode", 0), ("decode-batch", BATCH_NICE)):
        pid = stack.procs[name].process.pid  # type: ignore[union-attr]
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + niceness
