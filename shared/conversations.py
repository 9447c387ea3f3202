"""Stored conversations (docs/service-contract.md "Conversations"): the hash at ``Keys.conversation``.

The gateway creates the conversation; the inference worker (or the gateway, on a result-cache
hit) appends each finished turn with ``APPEND_TURN_LUA``, a compare-and-append: the user turn and
the answer are added only if the conversation still exists (a DELETE is never undone), still has
the job's image (a newer image is never overwritten by an older job), and still holds exactly the
history the job was built on (``len(spec.messages) - 1`` turns; of two concurrent jobs on the
same history only the first to finish is recorded, never a mix). Jobs without a
``conversation_id`` (OpenAI requests carry their own history) never write one.
"""

from __future__ import annotations

import json
import time
from typing import Any

from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec

# KEYS: conversation hash, job hash. ARGV: image digest ('' = any), expected stored turn count, new
# turns JSON, updated_at, ttl, the attempt that must have finished the job ('' = no check). Returns 1
# when appended, 0 when the conversation changed or another attempt finished the job (nothing
# written). Queued in the same MULTI as the job's FINISH, after it: a client that sees the job
# done already finds its turn in the conversation.
APPEND_TURN_LUA = """
if ARGV[6] ~= '' and redis.call('HGET', KEYS[2], 'finished_attempt') ~= ARGV[6] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'image_digest') ~= ARGV[1] then return 0 end
local raw = redis.call('HGET', KEYS[1], 'messages')
local turns = (raw and raw ~= '') and cjson.decode(raw) or {}
if #turns ~= tonumber(ARGV[2]) then return 0 end
for _, turn in ipairs(cjson.decode(ARGV[3])) do table.insert(turns, turn) end
redis.call('HSET', KEYS[1], 'messages', cjson.encode(turns), 'updated_at', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def turns_json(turns: list[ChatTurn]) -> str:
    """Turns as stored; a turn without images is written as the previous release wrote it."""
    return json.dumps([t.model_dump(mode="json", exclude_defaults=True) for t in turns])


def record_turn(
    pipe: Any, keys: Keys, spec: JobSpec, answer: str, ttl_s: int, attempt: int | None = None
) -> None:
    """Queue the compare-and-append on ``pipe`` (sync or asyncio); no-op without a conversation.
    ``attempt``: append only if that attempt finished the job (a worker's FINISH in the same MULTI)."""
    if not spec.conversation_id or not spec.messages:
        return
    new = turns_json([spec.messages[-1], ChatTurn(role="assistant", text=answer)])
    fence = "" if attempt is None else str(attempt)
    args = [spec.image_digest or "", len(spec.messages) - 1, new, time.time(), ttl_s, fence]
    conversation = keys.conversation(spec.conversation_id, spec.tenant)
    pipe.eval(APPEND_TURN_LUA, 2, conversation, keys.job(spec.job_id), *args)


def load_messages(raw: bytes | str | None) -> list[ChatTurn]:
    """Parse the ``messages`` field of a conversation hash (Lua's cjson writes ``{}`` for an empty list)."""
    if not raw:
        return []
    parsed = json.loads(raw)
    return [ChatTurn.model_validate(t) for t in parsed] if isinstance(parsed, list) else []
