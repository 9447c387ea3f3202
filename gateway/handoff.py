"""A text-only job skips the decode worker: the gateway hands it to inference itself.

The same two steps as the decode worker's hand-over (``worker.pipeline``): ``ROUTE_LUA`` names the
live owner of the job's session KV (a read, before the MULTI), then ``HANDOFF_LUA`` moves the job
from ``queued`` to ``waiting`` and adds its entry to the chosen stream, atomically, inside the
caller's MULTI (with the job's and the conversation's writes; with replicas to wait for, a second
MULTI after the record's). A gateway that dies between those two leaves it ``queued``: the sweeper
then gives it a decode task, which finds no image and hands it over the same way.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.state import GatewayState
from shared.jobs import HANDOFF_LUA, ROUTE_LUA, job_keys, pipe_script, status_args
from shared.jobs.routing import route_keys, stream_for
from shared.schemas import JobSpec, JobStatus


async def inference_stream(state: GatewayState, spec: JobSpec) -> str:
    """The stream this job goes to (its session's owner when alive and routing is on)."""
    settings = state.settings
    if spec.priority == "batch" or not settings.affinity_routing:
        return stream_for(state.keys, spec, None, settings.affinity_routing)
    alive_since = time.time() - settings.worker_stale_s
    owner = await state.redis.eval(ROUTE_LUA, 3, *route_keys(state.keys, spec), alive_since)
    return stream_for(state.keys, spec, owner or None, settings.affinity_routing)


def queue_handoff(pipe: Any, state: GatewayState, spec: JobSpec, stream: str) -> None:
    """Queue ``HANDOFF_LUA`` on ``pipe``: queued -> waiting, entry in ``stream``."""
    args = [*status_args(JobStatus.WAITING, time.time(), state.settings.job_ttl_s), spec.job_id]
    pipe_script(pipe, HANDOFF_LUA, [*job_keys(state.keys, spec.job_id), stream], args)
