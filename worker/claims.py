"""A decode task takes the queue's next waiting jobs itself, one at a time, after its own.

Every job costs Celery's dispatch (the main process fetches the message and hands it to a pool
child, the child runs the task's bookkeeping): ~0.7 CPU-ms a job here (bench/README.md), a third
of decoding a small picture. When the decode workers fall behind, messages wait in the broker's
list: a child that has just handed its own job over pops the oldest waiting message (one Redis
round trip) and decodes that job in the same task, instead of going back through Celery for it.

Claims change nothing that a job's own task would have done: the same ``DecodePipeline.run``, the
same job scripts. A task claims from the queue it came from only, and a batch task only while the
interactive queue is empty: batch work never delays interactive work, and a worker that serves the
batch queue alone (at a lower CPU priority) never takes interactive jobs. What keeps them safe:

- A claim is atomic (``CLAIM_LUA``): the message leaves the broker's list and is kept under the
  claiming task's id (``keys.decode_claim``) in one script, so no other task can take it too; a
  claim call re-run after a lost reply answers the claim it made.
- A task has one claimed job in flight at a time, so a job that crashes its decoder costs no other
  job an attempt, and is dead-lettered as before.
- A task whose child died mid-claim is requeued under the same id (reject on worker lost; kombu
  puts it at the back of the queue). When it runs again, its first claim puts the kept message back
  at the queue's consuming end and takes nothing in that run; if another task claims the requeued
  message first, that claim puts the kept one back. A claimed job that meets a Redis error goes
  back the same way (the claiming task's retries are not the job's).
- A kept message that nothing puts back (a whole node died: no redelivery without ack emulation)
  expires; its job, still ``queued``/``decoding``, is re-enqueued by the inference workers'
  sweeper (``VLMQ_STUCK_AFTER_S``), as the task's own job is.
- Claims stop ``CLAIM_BUDGET_S`` after the task started (``worker.tasks``): a claimed job keeps
  nearly all of the task's soft time limit.
- A message the claim cannot run (another task, a countdown retry's ``eta``) goes back where it was.

An interactive task also waits for the next job (``VLMQ_DECODE_LINGER_S``): where nothing waits, the
claim call arms the task's claim (a list holding only ``ARMED``, with the claim's TTL), and ``wait``
blocks in ``BLMOVE`` from the queue into it, so a job pushed meanwhile is the task's the moment it
leaves the queue; the ``vet`` call then keeps it like any claim. A job that arrives a few
milliseconds after the last one so skips Celery's dispatch too (the main process's fetch, the hand-off
to a child, and where Flower runs, the task's events). While every child of a worker waits, its main
process fetches nothing (its prefetch is spent on them), so a task arms only while the batch queue
its worker also serves is empty: a batch job waits at most one linger, or one interactive decode.

Flower shows the claiming task only; the job hash's ``decode_task`` names the task that decoded it
and ``vlmq_decode_claimed_jobs_total`` counts claims.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.keys import Keys
from shared.metrics_hash import series

CLAIMED_SERIES = series("decode_claimed_jobs_total")  # vlmq_decode_claimed_jobs_total on /metrics

log = logging.getLogger(__name__)
ReadJob = Callable[
    [Any, str], None
]  # queues a job's first read on a pipeline (``DecodePipeline.queue_read``)

# KEYS: the task's claim key, the list of the queue it came from, the metrics counters hash, a list
# whose messages stop a task from arming (the batch queue of a worker that also serves it; else the
# queue's own list, empty by then), then the lists of the queues before it in priority order (a
# batch claim waits while they hold work).
# ARGV: mode, the task name a claim may take, the claim key's TTL, the claim keys' prefix (a claimed
# message may be a requeued task's: its kept claim goes back too), the counter's field, the message
# of the claim being ended ("next"/"release"), and "1" to arm.
# Modes: "first" (a kept claim goes back and nothing is taken; else take one), "next" (end the
# claim, take one), "release" (end the claim), "return" (a kept claim goes back; take nothing),
# "vet" (after a wait: keep the message it moved if a claim may run it; nothing moved: disarm).
# "next" and "vet" are idempotent: re-run after a lost reply, they answer the claim already made.
# A claim key is a string (the kept message, its job in progress) or a list: armed (ARMED alone,
# with the claim TTL), with the message(s) a wait's BLMOVE moved in at its head. A job starts only
# once "vet" made its message a string, so a list's messages always go back to the queue unrun.
CLAIM_LUA = """
local ARMED = ''
local function oldest_in(key)  -- a list's first arrival; ARMED is last where the list was armed
  for _, at in ipairs({-1, -2}) do
    local message = redis.call('LINDEX', key, at)
    if message and message ~= ARMED then return message end
  end
  return false
end
local function kept_of(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then return redis.call('GET', key), kind end
  if kind == 'list' then return oldest_in(key), kind end
  return false, kind
end
local function put_back(key, kind)  -- back at the queue's consuming end, the oldest last
  if kind == 'list' then
    for _, message in ipairs(redis.call('LRANGE', key, 0, -1)) do
      if message ~= ARMED then redis.call('RPUSH', KEYS[2], message) end
    end
  else
    redis.call('RPUSH', KEYS[2], redis.call('GET', key))
  end
  redis.call('DEL', key)
end
local function runnable(message)
  local ok, envelope = pcall(cjson.decode, message)
  local headers = ok and type(envelope) == 'table' and envelope['headers']
  if type(headers) == 'table' and headers['task'] == ARGV[2]
      and (headers['eta'] == nil or headers['eta'] == cjson.null) then
    return headers
  end
  return false
end
local function keep(message, headers)  -- the claim is made: a requeued task's own claim goes back
  if type(headers['id']) == 'string' then
    local theirs = ARGV[4] .. headers['id']
    local their_kept, their_kind = kept_of(theirs)
    if their_kept then put_back(theirs, their_kind) else redis.call('DEL', theirs) end
  end
  redis.call('SET', KEYS[1], message, 'EX', tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  return {'claimed', message}
end
local mode = ARGV[1]
local kept, kind = kept_of(KEYS[1])
if mode == 'vet' then
  if kind == 'string' then return {'claimed', kept} end  -- this wait's own vet, re-sent
  if not kept then redis.call('DEL', KEYS[1]) return {'released'} end
  -- later arrivals (a BLMOVE re-sent after a lost reply) go back, the oldest of them last
  for _, message in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    if message ~= ARMED and message ~= kept then redis.call('RPUSH', KEYS[2], message) end
  end
  redis.call('DEL', KEYS[1])
  local headers = runnable(kept)
  if headers then return keep(kept, headers) end
  redis.call('RPUSH', KEYS[2], kept)
  return {'none'}
end
if kept and (mode == 'first' or mode == 'return' or kind == 'list') then
  put_back(KEYS[1], kind)  -- a list's messages were never vetted: unrun, whatever the mode
  if mode == 'first' or mode == 'return' then return {'returned', kept} end
  kept = false
end
if mode == 'return' then redis.call('DEL', KEYS[1]) return {'none'} end
if kept and mode ~= 'first' and kept ~= ARGV[6] then
  if mode == 'next' then return {'claimed', kept} end
  return {'released'}
end
redis.call('DEL', KEYS[1])
if mode == 'release' then return {'released'} end
for i = 5, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {'none'} end
end
local message = redis.call('RPOP', KEYS[2])
if not message then
  if ARGV[7] == '1' and redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('RPUSH', KEYS[1], ARMED)
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
    return {'armed'}
  end
  return {'none'}
end
local headers = runnable(message)
if headers then return keep(message, headers) end
redis.call('RPUSH', KEYS[2], message)
return {'none'}
"""


@dataclass(frozen=True)
class Claim:
    """One claim's answer: ``claimed`` (``message`` and, where it names one, ``job_id`` set),
    ``returned`` (a kept claim went back to the queue), ``armed`` (nothing waited: the task may
    ``wait`` for the next message), ``none`` or ``released``."""

    outcome: str
    message: bytes = b""
    job_id: str | None = None
    read: list[Any] | None = None  # what ``wait``'s ``read_job`` queued, sent with the vet


class DecodeClaims:
    """The claims of decode tasks, each by its id and the queue it came from, against the sync Redis
    client of the process. ``queues``: every queue in priority order (a queue claims only while
    the queues before it are empty); ``served``: those this worker consumes (a task arms only while
    the later ones it serves are empty: its wait would hold up their jobs)."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        task_name: str,
        ttl_s: int,
        queues: Sequence[str],
        served: Sequence[str] = (),
    ):
        self.r = client
        self.keys = keys
        self.task_name = task_name
        self.ttl_s = ttl_s
        self.queues = list(queues)
        self.served = set(served) or set(queues)  # the worker's queues (its ``-Q``)
        self._script = client.register_script(CLAIM_LUA)

    def first(self, task_id: str, queue: str, arm: bool = False) -> Claim:
        """The task's first claim; a kept claim (the task runs again after its process died) goes
        back to the queue instead, and nothing is taken. ``arm``: where nothing waits, the answer is
        ``armed`` (the task may then ``wait``), unless a later queue the worker serves holds jobs."""
        return self._call(task_id, queue, "first", arm=arm)

    def next(self, task_id: str, queue: str, done: Claim, arm: bool = False) -> Claim:
        """Ends the claim ``done`` (its job is done) and claims the oldest waiting message."""
        return self._call(task_id, queue, "next", done.message, arm)

    def wait(self, task_id: str, queue: str, timeout_s: float, read_job: ReadJob | None = None) -> Claim:
        """After an ``armed`` answer: the queue's next message, waited for up to ``timeout_s`` (one
        ``BLMOVE`` into the armed claim, so it is the task's the moment it leaves the queue), kept if
        a claim may run it. Nothing came: the armed claim is ended (``released``). ``read_job``
        queues the commands of the moved job's first read on the vet's pipeline (one round trip for
        both); their replies are the claim's ``read`` where the vet kept that job."""
        claim_key = self.keys.decode_claim(task_id)
        moved = self.r.blmove(self.keys.decode_queue(queue), claim_key, timeout_s, "RIGHT", "LEFT")
        # the vet whatever the reply: a BLMOVE re-sent after a lost reply may time out although the
        # first one moved a message (the claim list tells what came)
        pipe = self.r.pipeline(transaction=False)
        keys, args = self._script_call(task_id, queue, "vet")
        pipe.eval(CLAIM_LUA, len(keys), *keys, *args)  # EVAL: no SCRIPT EXISTS round trip (pipe_script)
        job_id = job_of(moved) if moved is not None and read_job is not None else None
        if job_id is not None and read_job is not None:
            read_job(pipe, job_id)
        reply, *read = pipe.execute()
        claim = self._answer(task_id, reply)
        if job_id is None or claim.job_id != job_id:  # nothing read, or the vet kept another job
            return claim
        return Claim(claim.outcome, claim.message, claim.job_id, read)

    def release(self, task_id: str, queue: str, done: Claim) -> None:
        """Ends the claim ``done`` without taking another."""
        self._call(task_id, queue, "release", done.message)

    def give_back(self, task_id: str, queue: str) -> Claim:
        """A kept claim goes back to the queue, unfinished; nothing is taken."""
        return self._call(task_id, queue, "return")

    def _call(self, task_id: str, queue: str, mode: str, message: bytes = b"", arm: bool = False) -> Claim:
        keys, args = self._script_call(task_id, queue, mode, message, arm)
        return self._answer(task_id, self._script(keys=keys, args=args))

    def _script_call(
        self, task_id: str, queue: str, mode: str, message: bytes = b"", arm: bool = False
    ) -> tuple[list[str], list[Any]]:
        at = self.queues.index(queue) if queue in self.queues else len(self.queues)
        later = [q for q in self.queues[at + 1 :] if q in self.served]
        keys = [
            self.keys.decode_claim(task_id),
            self.keys.decode_queue(queue),
            self.keys.metrics_counters(),
            self.keys.decode_queue(later[0] if later else queue),
            *(self.keys.decode_queue(q) for q in self.queues[:at]),
        ]
        prefix = self.keys.decode_claim("")
        return keys, [mode, self.task_name, self.ttl_s, prefix, CLAIMED_SERIES, message, "1" if arm else "0"]

    @staticmethod
    def _answer(task_id: str, reply: Any) -> Claim:
        outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if outcome == "returned":
            log.warning("task %s: its claimed job goes back to the queue, unfinished", task_id)
        if outcome != "claimed":
            return Claim(outcome)
        kept = reply[1] if isinstance(reply[1], bytes) else str(reply[1]).encode()
        job_id = job_of(kept)
        if job_id is None:  # Celery could not have run it either
            log.error("task %s claimed a message with no job id; dropped: %r", task_id, kept[:200])
        return Claim(outcome, kept, job_id)


def job_of(message: bytes | str) -> str | None:
    """The job id a ``vlmq.decode`` message carries (kombu's envelope around protocol 2's body)."""
    try:
        envelope = json.loads(message)
        args = json.loads(base64.b64decode(envelope["body"]))[0]
        return str(args[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


__all__ = ["CLAIM_LUA", "Claim", "DecodeClaims", "job_of"]
