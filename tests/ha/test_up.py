"""`make up` with a ``sentinel://`` VLMQ_REDIS_URL: reachability and the Redis description go
through the master the sentinels name."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.up import choose_redis, print_redis
from shared.config import CommonSettings
from tests.support.sentinel import MASTER_NAME, SentinelCluster


def test_make_up_checks_and_describes_the_sentinels_master(
    cluster: SentinelCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLMQ_REDIS_URL", cluster.url)
    monkeypatch.setenv("VLMQ_REDIS_SENTINEL_MASTER", MASTER_NAME)
    monkeypatch.setenv("VLMQ_REDIS_MIN_REPLICAS", "2")
    assert choose_redis() == (cluster.url, None)
    print_redis(cluster.url, None, CommonSettings())
    out, err = capsys.readouterr()
    assert f"(master '{MASTER_NAME}' at 127.0.0.1:{cluster.master().port})" in out
    assert "persistence: none" in out and "1 replica(s) (VLMQ_REDIS_MIN_REPLICAS=2)" in out
    assert "every submission is refused (503)" in err

    monkeypatch.setenv("VLMQ_REDIS_SENTINEL_MASTER", "no-such-master")
    with pytest.raises(SystemExit, match="not reachable"):
        choose_redis()
