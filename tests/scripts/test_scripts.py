"""Entry-point helpers: .env.example is complete, the Redis launcher works, make test fails on no tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.env_example import ROOT
from scripts.env_example import main as env_example_main
from scripts.redis_launcher import reachable, start_redis


def test_env_example_lists_every_setting() -> None:
    assert env_example_main(["--check"]) == 0


def test_embedded_redis_starts_and_stops() -> None:
    server = start_redis()
    try:
        assert reachable(server.url)
    finally:
        server.stop()
    assert not reachable(server.url)


def test_run_tests_fails_when_nothing_is_collected() -> None:
    cmd = [sys.executable, "-m", "scripts.run_tests", "tests/scripts", "-k", "no_such_test_name", "-q"]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 1


def test_make_up_uses_the_redis_of_dot_env_and_refuses_an_unreachable_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    from scripts.up import choose_redis

    monkeypatch.delenv("VLMQ_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"VLMQ_REDIS_URL={redis_url}\n")
    assert choose_redis() == (redis_url, None)
    (tmp_path / ".env").write_text("VLMQ_REDIS_URL=redis://127.0.0.1:1/0\n")
    with pytest.raises(SystemExit, match="not reachable"):
        choose_redis()
