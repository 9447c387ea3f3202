"""Done jobs' metric increments are summed in memory and written once a period, one command per
field, with the same totals as writing each increment (against a real Redis)."""

from __future__ import annotations

from typing import Any

from services.inference_worker.metrics_buffer import MetricsBuffer
from shared import metrics_hash
from shared.keys import Keys


def test_summed_increments_equal_the_increments(redis_client: Any, keys: Keys) -> None:
    key = keys.metrics_counters()
    direct, summed = f"{key}:direct", f"{key}:summed"
    buffer = MetricsBuffer(period_s=3600)
    pipe = redis_client.pipeline(transaction=False)
    for value in (0.004, 0.02, 0.3, 7.0, 0.02):
        metrics_hash.observe(pipe, direct, "time_to_first_token_seconds", value)
        metrics_hash.observe(buffer, summed, "time_to_first_token_seconds", value)
    pipe.execute()
    assert not buffer.due() and redis_client.hlen(summed) == 0  # nothing written before its period
    buffer.period_s = 0.0
    assert buffer.due()
    buffer.flush(redis_client)
    want, got = redis_client.hgetall(direct), redis_client.hgetall(summed)
    assert want.keys() == got.keys()
    assert all(abs(float(want[k]) - float(got[k])) < 1e-9 for k in want)
    assert not buffer.due()  # flushed: nothing pending
