"""The recent-latency list (``shared.recent_jobs``) on a real Redis."""

from __future__ import annotations

import json

import redis

from shared import recent_jobs
from shared.keys import Keys
from shared.schemas import StageTimings, UsageInfo


def test_capped_newest_first_and_summarised(redis_client: redis.Redis, keys: Keys) -> None:
    for i in range(recent_jobs.KEEP + 5):
        pipe = redis_client.pipeline()
        timings = StageTimings(ttft=0.01 * (i + 1), total=0.1 * (i + 1), generation=0.5)
        recent_jobs.record(pipe, keys, timings, UsageInfo(completion_tokens=11))
        pipe.execute()
    raw = redis_client.lrange(keys.recent_jobs(), 0, -1)
    assert len(raw) == recent_jobs.KEEP and json.loads(raw[0])["ttft"] == 0.01 * (recent_jobs.KEEP + 5)
    summary = recent_jobs.summary(raw, now=json.loads(raw[0])["at"] + 2)
    assert summary["jobs"] == recent_jobs.KEEP and summary["window_s"] >= 2
    ttfts = sorted(json.loads(e)["ttft"] for e in raw)
    assert summary["ttft_s"] == {"p50": ttfts[49], "p95": ttfts[94]}  # nearest rank
    assert summary["tokens_per_s"] == 20.0  # 10 tokens after the first, in 0.5 s each


def test_nothing_yet_and_foreign_entries() -> None:
    assert recent_jobs.summary([]) == {"jobs": 0}
    assert recent_jobs.summary([b"not json", b'{"at": 1}']) == {"jobs": 0}
