"""Jobs the gateway hands to inference itself, skipping the decode worker.

- **Text only** (nothing to decode): the same two steps as the decode worker's hand-over
  (``worker.pipeline``): ``ROUTE_LUA`` names the live owner of the job's session KV (a read before
  the MULTI, sharing the admission's round trip: ``plan_route``, ``queue_route_read``), then
  ``HANDOFF_LUA`` moves the job from ``queued`` to ``waiting`` and adds its entry to the chosen
  stream, atomically, inside the caller's MULTI (with the job's and the conversation's writes; with
  replicas to wait for, a second MULTI after the record's). A gateway that dies between those two
  leaves it ``queued``: the sweeper then gives it a decode task, which finds no image and hands it
  over the same way.
- **A job whose images a live worker already decoded** (``may_skip_decoding``: a follow-up about
  pictures shown before, or a picture sent before by the same tenant): the worker that decoded them
  keeps them (``services.inference_worker.image_inputs``) and says so in owner records
  (``input_owners``). ``ROUTE_HOLDER_LUA`` names the one live worker holding every image, while
  every live worker is of a release that keeps them (and, for a follow-up, unless its session KV
  is on another live worker); the job is then handed to its stream the same way, marked
  ``decode_skipped``, with no pixels. Should the worker that takes it not hold them after all
  (evicted since, restarted, the entry moved or claimed), it sends the job back to decoding
  (``RETURN_TO_DECODING_LUA``). No such worker: a decode task, as for any job with images.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gateway.state import GatewayState
from shared.jobs import HANDOFF_LUA, ROUTE_HOLDER_LUA, ROUTE_LUA, job_keys, pipe_script, status_args
from shared.jobs.routing import (
    DECODE_SKIPPED,
    holder_keys,
    is_follow_up,
    may_skip_decoding,
    needs_decoding,
    route_keys,
    stream_for,
)
from shared.schemas import JobSpec, JobStatus


@dataclass(frozen=True)
class NextStage:
    """Where an accepted job goes: a decode task (``stream`` None) or an inference stream."""

    stream: str | None = None
    decode_skipped: bool = False  # has images, handed over without pixels


class Route(Enum):
    """The routing read a job needs before its writes (``plan_route``)."""

    DECODE = "decode"  # a decode task: nothing to read
    SHARED = "shared"  # text only, to the shared (or batch) stream: nothing to read
    OWNER = "owner"  # text only: ``ROUTE_LUA``, its session's live owner
    HOLDER = "holder"  # a job that may skip decoding: ``ROUTE_HOLDER_LUA``


def plan_route(state: GatewayState, spec: JobSpec) -> Route:
    """Which read decides the job's next stage."""
    settings = state.settings
    if not needs_decoding(spec):
        routed = spec.priority != "batch" and settings.affinity_routing
        return Route.OWNER if routed else Route.SHARED
    if not (settings.reuse_decoded_images and settings.affinity_routing and may_skip_decoding(spec)):
        return Route.DECODE
    return Route.HOLDER


def queue_route_read(pipe: Any, state: GatewayState, spec: JobSpec, route: Route) -> bool:
    """Queue the route's read on ``pipe`` (a pipeline: it shares a round trip with admission);
    False when it needs none (its reply is then not in the pipeline's)."""
    keys, alive_since = state.keys, time.time() - state.settings.worker_stale_s
    if route is Route.OWNER:
        pipe.eval(ROUTE_LUA, 3, *route_keys(keys, spec), alive_since)
    elif route is Route.HOLDER:
        held = holder_keys(keys, spec, state.settings.result_cache_shared)
        follow_up = "1" if is_follow_up(spec) else "0"
        pipe.eval(ROUTE_HOLDER_LUA, len(held), *held, alive_since, keys.worker_heartbeat(""), follow_up)
    return route in (Route.OWNER, Route.HOLDER)


def next_stage(state: GatewayState, spec: JobSpec, route: Route, owner: Any = None) -> NextStage:
    """The job's next stage from its route and its read's reply (the owner, or none)."""
    keys, routing = state.keys, state.settings.affinity_routing
    if route is Route.DECODE or (route is Route.HOLDER and not owner):
        return NextStage()
    return NextStage(stream_for(keys, spec, owner or None, routing), decode_skipped=route is Route.HOLDER)


async def read_next_stage(state: GatewayState, spec: JobSpec) -> NextStage:
    """``next_stage`` with a round trip of its own (where no admission read runs beside it)."""
    route = plan_route(state, spec)
    async with state.redis.pipeline(transaction=False) as pipe:
        reads = queue_route_read(pipe, state, spec, route)
        replies = await pipe.execute() if reads else [None]
    return next_stage(state, spec, route, replies[0])


def queue_handoff(pipe: Any, state: GatewayState, spec: JobSpec, stage: NextStage) -> None:
    """Queue ``HANDOFF_LUA`` on ``pipe``: queued -> waiting, entry in the stage's stream (and, for
    a turn handed over without pixels, the mark that tells its worker so, after it: the MULTI
    makes both visible at once)."""
    assert stage.stream is not None
    args = [*status_args(JobStatus.WAITING, time.time(), state.settings.job_ttl_s), spec.job_id]
    pipe_script(pipe, HANDOFF_LUA, [*job_keys(state.keys, spec.job_id), stage.stream], args)
    if stage.decode_skipped:
        pipe.hset(state.keys.job(spec.job_id), DECODE_SKIPPED, "1")
