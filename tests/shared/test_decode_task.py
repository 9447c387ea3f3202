"""The decode-task message the gateway and the sweeper push is the one Celery's ``send_task`` publishes."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import redis

from shared.config import GatewaySettings
from shared.decode_task import BATCH_QUEUE, DECODE_QUEUE, DECODE_TASK, MAX_CHILD_RSS_KB, DecodeTasks

IDS = ("id", "root_id", "correlation_id", "delivery_tag", "reply_to", "origin")


def _masked(message: dict[str, Any]) -> dict[str, Any]:
    """The envelope with its per-message ids replaced by a placeholder."""
    out = json.loads(json.dumps(message))
    for part in (out["headers"], out["properties"]):
        for key in IDS:
            if key in part:
                part[key] = "<id>"
    return out


def test_envelope_matches_send_task(redis_url: str) -> None:
    prefix = f"vlmqtest-{uuid.uuid4().hex[:8]}"
    settings = GatewaySettings(_env_file=None, redis_url=redis_url, key_prefix=prefix)  # type: ignore[call-arg]
    queue = DecodeTasks(settings)
    r = redis.Redis.from_url(redis_url)
    try:
        queue.app.send_task(DECODE_TASK, args=["job-1"], queue=DECODE_QUEUE)
        celery_raw = r.lrange(
            queue.keys.decode_queue(), 0, -1
        )  # send_task pushed onto the list the gateway uses
        assert len(celery_raw) == 1
        celery_msg = json.loads(celery_raw[0])
        ours = json.loads(queue.message("job-1"))
        assert _masked(ours) == _masked(celery_msg)
        assert json.loads(base64.b64decode(ours["body"]))[0] == ["job-1"]
        assert ours["headers"]["id"] == ours["properties"]["correlation_id"] == ours["headers"]["root_id"]
        assert queue.message("job-1") != queue.message("job-1")  # fresh task id and delivery tag
        pipe = r.pipeline(transaction=True)
        queue.push(pipe, "job-2")
        queue.push(pipe, "job-3", "batch")
        pipe.execute()
        assert r.llen(queue.keys.decode_queue()) == 2
        batch = json.loads(r.lindex(queue.keys.decode_queue(BATCH_QUEUE), 0) or b"{}")
        assert batch["properties"]["delivery_info"]["routing_key"] == BATCH_QUEUE
    finally:
        queue.close()
        r.close()


def test_decode_children_are_replaced_by_memory_not_by_task_count(redis_url: str) -> None:
    """A task-count limit recycled every child at about the same moment (they share the load
    evenly), stalling the queue for the new children's warm-up: the soak's p99 spikes."""
    settings = GatewaySettings(_env_file=None, redis_url=redis_url)  # type: ignore[call-arg]
    conf = DecodeTasks(settings).app.conf
    assert conf.worker_max_tasks_per_child is None
    assert conf.worker_max_memory_per_child == MAX_CHILD_RSS_KB
