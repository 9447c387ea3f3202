"""A decode task takes the queue's next waiting jobs itself, one at a time, after its own.

Every job costs Celery ~2 CPU-ms of dispatch (the main process fetches the message and hands it
to a pool child, the child runs the task's bookkeeping), as much as decoding a small picture.
When the decode workers fall behind, messages wait in the broker's list: a child that has just
finished its own job pops the oldest waiting message (one Redis round trip) and decodes that job
in the same task, instead of going back through Celery for it.

Claims change nothing that a job's own task would have done: the same ``DecodePipeline.run``, the
same job scripts. A task claims from the queue it came from only: a worker that serves the batch
queue alone (at a lower CPU priority) never takes interactive jobs. What keeps them safe:

- A claim is atomic (``CLAIM_LUA``): the message leaves the broker's list and is kept under the
  claiming task's id (``keys.decode_claim``) in one script, so no other task can take it too.
- A task whose process died mid-claim is redelivered with the same id (reject on worker lost), or
  retried with it (Redis errors): its first claim then puts the kept message back at the queue's
  consuming end and claims nothing more in that run. If another task claims the redelivered
  message instead, that claim puts the kept one back. A task has one claimed job in flight at a
  time, so a job that crashes its decoder costs no other job an attempt, and is dead-lettered as
  before.
- A task that dies with its whole node (no redelivery without ack emulation) leaves the kept
  message to expire; its job is re-enqueued by the inference workers' sweeper
  (``VLMQ_STUCK_AFTER_S``), as the task's own job is.
- A message the claim cannot run (another task, a countdown retry's ``eta``) goes back where it was.

Flower shows the claiming task only; the job hash's ``decode_task`` names the task that decoded it.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

from shared.keys import Keys
from shared.metrics_hash import series

CLAIMED_SERIES = series("decode_claimed_jobs_total")  # vlmq_decode_claimed_jobs_total on /metrics

log = logging.getLogger(__name__)

# KEYS: the task's claim key, the list of the queue it came from, the metrics counters hash.
# ARGV: mode ("first" | "next" | "release"), the task name a claim may take, the claim key's TTL,
# the claim keys' prefix (a claimed message may be a redelivered task's: its claim goes back too),
# the counter's field.
CLAIM_LUA = """
local kept = redis.call('GET', KEYS[1])
if ARGV[1] == 'first' and kept then
  redis.call('RPUSH', KEYS[2], kept)  -- the tail: the next message a worker fetches
  redis.call('DEL', KEYS[1])
  return {'returned', kept}
end
redis.call('DEL', KEYS[1])
if ARGV[1] == 'release' then return {'released'} end
local message = redis.call('RPOP', KEYS[2])
if not message then return {'none'} end
local ok, envelope = pcall(cjson.decode, message)
local headers = ok and type(envelope) == 'table' and envelope['headers']
if type(headers) == 'table' and headers['task'] == ARGV[2]
    and (headers['eta'] == nil or headers['eta'] == cjson.null) then
  if type(headers['id']) == 'string' then
    local theirs = ARGV[4] .. headers['id']
    local their_claim = redis.call('GET', theirs)
    if their_claim then
      redis.call('RPUSH', KEYS[2], their_claim)
      redis.call('DEL', theirs)
    end
  end
  redis.call('SET', KEYS[1], message, 'EX', tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  return {'claimed', message}
end
redis.call('RPUSH', KEYS[2], message)
return {'none'}
"""


@dataclass(frozen=True)
class Claim:
    """One claim's answer: ``claimed`` (``job_id`` set), ``returned`` (a redelivered task put its
    earlier claim back), ``none`` or ``released``."""

    outcome: str
    job_id: str | None = None


class DecodeClaims:
    """The claims of decode tasks, each by its id and the queue it came from, against the sync Redis
    client of the process."""

    def __init__(self, client: Any, keys: Keys, task_name: str, ttl_s: int):
        self.keys = keys
        self.task_name = task_name
        self.ttl_s = ttl_s
        self._script = client.register_script(CLAIM_LUA)

    def first(self, task_id: str, queue: str) -> Claim:
        """The task's first claim: returns a redelivered run's earlier claim to the queue, if any."""
        return self._call(task_id, queue, "first")

    def next(self, task_id: str, queue: str) -> Claim:
        """Ends the previous claim (its job is done) and claims the oldest waiting message."""
        return self._call(task_id, queue, "next")

    def release(self, task_id: str, queue: str) -> None:
        """Ends the last claim without taking another."""
        self._call(task_id, queue, "release")

    def _call(self, task_id: str, queue: str, mode: str) -> Claim:
        keys = [self.keys.decode_claim(task_id), self.keys.decode_queue(queue), self.keys.metrics_counters()]
        args = [mode, self.task_name, self.ttl_s, self.keys.decode_claim(""), CLAIMED_SERIES]
        reply = self._script(keys=keys, args=args)
        outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if outcome == "returned":
            log.warning("task %s was run again: its claimed job goes back to the queue", task_id)
        job_id = job_of(reply[1]) if outcome == "claimed" else None
        if outcome == "claimed" and job_id is None:  # Celery could not have run it either
            log.error("task %s claimed a message with no job id; dropped: %r", task_id, reply[1][:200])
        return Claim(outcome, job_id)


def job_of(message: bytes | str) -> str | None:
    """The job id a ``vlmq.decode`` message carries (kombu's envelope around protocol 2's body)."""
    try:
        envelope = json.loads(message)
        args = json.loads(base64.b64decode(envelope["body"]))[0]
        return str(args[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


__all__ = ["CLAIM_LUA", "Claim", "DecodeClaims", "job_of"]
