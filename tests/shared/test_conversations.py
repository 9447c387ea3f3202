"""Stored conversations: the compare-and-append that records a finished turn."""

from __future__ import annotations

import json
from typing import Any

from shared.conversations import load_messages, record_turn
from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec
from tests.support import jobs as J


def test_turn_is_recorded_by_compare_and_append(redis_client: Any, keys: Keys) -> None:
    """Concurrent jobs on one history, a newer image, a deleted conversation, a job without one."""

    def record(spec: JobSpec, answer: str) -> int:
        pipe = redis_client.pipeline()
        record_turn(pipe, keys, spec, answer, 600)
        return int((pipe.execute() or [0])[0])

    sid, key = "sess-1", keys.conversation("sess-1")
    redis_client.hset(key, mapping={"image_digest": "d1", "messages": json.dumps([])})
    a = J.make_spec("first?", "d1", conversation_id=sid)
    b = J.make_spec("second?", "d1", conversation_id=sid)  # built on the same (empty) history
    assert record(a, "A") == 1 and record(b, "B") == 0  # b would overwrite a's turn
    assert [t.text for t in load_messages(redis_client.hget(key, "messages"))] == ["first?", "A"]
    redis_client.hset(key, mapping={"image_digest": "d2", "messages": "[]"})  # a newer image
    assert record(J.make_spec("old image?", "d1", conversation_id=sid), "C") == 0
    redis_client.delete(key)
    assert record(J.make_spec("x", "d2", conversation_id=sid), "D") == 0 and not redis_client.exists(key)
    redis_client.hset(key, mapping={"image_digest": "d2", "messages": "[]"})
    openai_spec = J.make_spec("y", "d2").model_copy(update={"affinity_key": sid})  # no conversation
    pipe = redis_client.pipeline()
    record_turn(pipe, keys, openai_spec, "E", 600)
    assert pipe.execute() == [] and redis_client.hget(key, "messages") == b"[]"
    history = [ChatTurn(role="user", text="q", image=True), ChatTurn(role="assistant", text="r")]
    redis_client.hset(key, "messages", json.dumps([t.model_dump() for t in history]))
    assert record(J.make_spec("next?", "d2", conversation_id=sid, history=history), "F") == 1
