"""The ``vlmq`` command against the real service (``service_stack``), run as a subprocess the way a
person runs it: ``python -m vlmq_cli`` with ``VLMQ_URL`` / ``VLMQ_API_KEY`` in its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.models import test_model_path
from tests.support.reference import Reference

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def vlmq(url: str, *args: str, key: str | None = None, timeout_s: float = 120) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in ("VLMQ_URL", "VLMQ_API_KEY")}
    env["VLMQ_URL"] = url
    if key is not None:
        env["VLMQ_API_KEY"] = key
    done = subprocess.run(
        [sys.executable, "-m", "vlmq_cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return Run(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="session")
def reference() -> Iterator[Reference]:
    ref = Reference(str(test_model_path()))
    yield ref
    ref.close()
