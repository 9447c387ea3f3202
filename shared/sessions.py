"""Stored conversations (docs/service-contract.md "Sessions"): the hash at ``Keys.session``.

The gateway creates the session; the inference worker records each finished turn. A job's
``messages`` are the whole conversation up to its user turn, so the stored conversation after
the job is exactly those messages plus the assistant's answer.
"""

from __future__ import annotations

import json
import time

import redis

from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec


def conversation_after(spec: JobSpec, answer: str) -> list[ChatTurn]:
    return [*spec.messages, ChatTurn(role="assistant", text=answer)]


def session_fields(spec: JobSpec, answer: str) -> dict[str, str]:
    """Fields written when ``spec`` is done (image fields only when the job carries an image)."""
    turns = conversation_after(spec, answer)
    fields = {
        "messages": json.dumps([t.model_dump(mode="json") for t in turns]),
        "updated_at": str(time.time()),
    }
    if spec.image_digest:
        fields["image_digest"] = spec.image_digest
    if spec.image_format:
        fields["image_format"] = spec.image_format
    return fields


def record_turn(pipe: redis.client.Pipeline, keys: Keys, spec: JobSpec, answer: str, ttl_s: int) -> None:
    """Queue the session update on ``pipe`` (no-op for jobs without a session)."""
    if not spec.session_id:
        return
    key = keys.session(spec.session_id)
    pipe.hset(key, mapping=dict(session_fields(spec, answer)))  # type: ignore[arg-type]
    pipe.expire(key, ttl_s)


def load_messages(raw: bytes | str | None) -> list[ChatTurn]:
    """Parse the ``messages`` field of a session hash."""
    if not raw:
        return []
    return [ChatTurn.model_validate(t) for t in json.loads(raw)]
