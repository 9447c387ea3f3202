"""`make test`: pytest over tests/ with the environment the tests need.

Tests start their own redis-server (tests/conftest.py), so nothing here touches a running
`make up`. Extra arguments go to pytest (``make test ARGS="-k decode"`` or
``python -m scripts.run_tests tests/worker -x``). The exit code is pytest's, except that "no
tests collected" counts as a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_TESTS_COLLECTED = 5


def test_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLMQ_")}  # never a developer's Redis
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


SEPARATE_SUITES = "not chaos and not browser"  # suites with their own make target (make test-chaos, ...)


def main(argv: list[str]) -> int:
    args = argv or [str(ROOT / "tests")]
    if os.environ.get("ARGS"):
        args = [*args, *os.environ["ARGS"].split()]
    if "-m" not in args:
        args = [*args, "-m", SEPARATE_SUITES]
    cmd = [sys.executable, "-m", "pytest", *args]
    code = subprocess.call(cmd, cwd=ROOT, env=test_env())
    if code == NO_TESTS_COLLECTED:
        print("run_tests: no tests were collected: failing", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
