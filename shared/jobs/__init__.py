"""The job: its record, its state machine (Lua scripts), its terminal event, the refusal rule.

A job is a Redis hash (``Keys.job``) plus an event stream (``Keys.job_events``). Every status
change goes through a Lua script in ``lua`` so it is atomic and a terminal state is written
exactly once, whoever gets there first (gateway cancel, decode worker, inference worker, a
retried attempt). The scripts append the matching event to the job's stream and publish a
wake-up on ``Keys.job_wake`` (pub/sub only wakes; the stream holds the data).

States (docs/service-contract.md has the diagram): queued -> decoding -> waiting -> generating
-> done | failed | cancelled | expired; a turn handed to inference without decoding may go back
to queued from waiting, or from generating when its worker died mid-answer
(``RETURN_TO_DECODING_LUA``).
"""

from shared.jobs.lua import (
    ADMIT_LUA,
    APPEND_TOKENS_LUA,
    BEGIN_ATTEMPT_LUA,
    DEL_IF_OWNER_LUA,
    FINISH_LUA,
    HANDOFF_LUA,
    MOVE_UNREAD_LUA,
    REDECODE_LUA,
    REQUEUE_INFERENCE_LUA,
    RETURN_TO_DECODING_LUA,
    ROUTE_HOLDER_LUA,
    ROUTE_LUA,
    SET_STATUS_LUA,
)
from shared.jobs.record import EVENTS_MAXLEN, JobRecord, new_job_hash
from shared.jobs.refusal import Refusal, past_deadline, refusal
from shared.jobs.writes import (
    finish_args,
    finish_call,
    job_keys,
    pipe_script,
    record_dead_letter,
    status_args,
    terminal_event,
)

__all__ = [
    "ADMIT_LUA",
    "APPEND_TOKENS_LUA",
    "BEGIN_ATTEMPT_LUA",
    "DEL_IF_OWNER_LUA",
    "EVENTS_MAXLEN",
    "FINISH_LUA",
    "HANDOFF_LUA",
    "MOVE_UNREAD_LUA",
    "REDECODE_LUA",
    "REQUEUE_INFERENCE_LUA",
    "RETURN_TO_DECODING_LUA",
    "ROUTE_HOLDER_LUA",
    "ROUTE_LUA",
    "SET_STATUS_LUA",
    "JobRecord",
    "Refusal",
    "finish_args",
    "finish_call",
    "job_keys",
    "new_job_hash",
    "past_deadline",
    "pipe_script",
    "record_dead_letter",
    "refusal",
    "status_args",
    "terminal_event",
]
