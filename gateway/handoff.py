"""Jobs the gateway hands to inference itself, skipping the decode worker.

- **Text only** (nothing to decode): the same two steps as the decode worker's hand-over
  (``worker.pipeline``): ``ROUTE_LUA`` names the live owner of the job's session KV (a read, before
  the MULTI), then ``HANDOFF_LUA`` moves the job from ``queued`` to ``waiting`` and adds its entry
  to the chosen stream, atomically, inside the caller's MULTI (with the job's and the
  conversation's writes; with replicas to wait for, a second MULTI after the record's). A gateway
  that dies between those two leaves it ``queued``: the sweeper then gives it a decode task, which
  finds no image and hands it over the same way.
- **A turn that shows no new image** (``skips_decoding``: a follow-up about pictures shown
  before): its images were decoded for an earlier turn, and the worker that ran it keeps them
  (``services.inference_worker.image_inputs``). While every live worker is of a release that keeps
  them (``gateway.image_holders``), ``ROUTE_HOLDER_LUA`` names that worker when it is alive; the job
  is then handed to its stream the same way, marked ``decode_skipped``, with no pixels. Should the
  worker that takes it not hold them (evicted, restarted, the entry moved or claimed), it sends the
  job back to decoding (``RETURN_TO_DECODING_LUA``). No owner: a decode task, as for any job with
  images.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.state import GatewayState
from shared.jobs import HANDOFF_LUA, ROUTE_HOLDER_LUA, ROUTE_LUA, job_keys, pipe_script, status_args
from shared.jobs.routing import DECODE_SKIPPED, needs_decoding, route_keys, skips_decoding, stream_for
from shared.schemas import JobSpec, JobStatus


@dataclass(frozen=True)
class NextStage:
    """Where an accepted job goes: a decode task (``stream`` None) or an inference stream."""

    stream: str | None = None
    decode_skipped: bool = False  # has images, handed over without pixels


async def next_stage(state: GatewayState, spec: JobSpec) -> NextStage:
    """A decode task, or (text only, or a turn whose images its worker holds) an inference stream."""
    if not needs_decoding(spec):
        return NextStage(await inference_stream(state, spec))
    settings = state.settings
    if not (settings.followups_skip_decoding and settings.affinity_routing and skips_decoding(spec)):
        return NextStage()
    keys = state.keys
    if not await state.image_holders.every_worker_keeps_images(state.redis, keys, settings.worker_stale_s):
        return NextStage()  # a rolling upgrade: a worker of the other release may get the turn
    alive_since, beats = time.time() - settings.worker_stale_s, keys.worker_heartbeat("")
    holder = await state.redis.eval(ROUTE_HOLDER_LUA, 3, *route_keys(keys, spec), alive_since, beats)
    if not holder:
        return NextStage()
    return NextStage(stream_for(keys, spec, holder, affinity_routing=True), decode_skipped=True)


async def inference_stream(state: GatewayState, spec: JobSpec) -> str:
    """The stream this job goes to (its session's owner when alive and routing is on)."""
    settings = state.settings
    if spec.priority == "batch" or not settings.affinity_routing:
        return stream_for(state.keys, spec, None, settings.affinity_routing)
    alive_since = time.time() - settings.worker_stale_s
    owner = await state.redis.eval(ROUTE_LUA, 3, *route_keys(state.keys, spec), alive_since)
    return stream_for(state.keys, spec, owner or None, settings.affinity_routing)


def queue_handoff(pipe: Any, state: GatewayState, spec: JobSpec, stage: NextStage) -> None:
    """Queue ``HANDOFF_LUA`` on ``pipe``: queued -> waiting, entry in the stage's stream (and, for
    a turn handed over without pixels, the mark that tells its worker so, after it: the MULTI
    makes both visible at once)."""
    assert stage.stream is not None
    args = [*status_args(JobStatus.WAITING, time.time(), state.settings.job_ttl_s), spec.job_id]
    pipe_script(pipe, HANDOFF_LUA, [*job_keys(state.keys, spec.job_id), stage.stream], args)
    if stage.decode_skipped:
        pipe.hset(state.keys.job(spec.job_id), DECODE_SKIPPED, "1")
