"""Which inference stream a job goes to, for whoever hands it over: the decode worker after
decoding, or the gateway for a job with no image to decode (text only).

``ROUTE_LUA`` names the live worker that owns the job's session KV or image features; the job
then goes to that worker's own stream when routing is on, else to the shared stream. Batch work
always goes to the batch stream.
"""

from __future__ import annotations

from shared.keys import Keys
from shared.schemas import JobSpec


def route_keys(keys: Keys, spec: JobSpec) -> list[str]:
    """KEYS of ``ROUTE_LUA`` for this job (its ARGV: the oldest heartbeat that counts as alive)."""
    return [
        keys.session_owner(spec.affinity_key or ""),
        keys.image_owner(spec.image_digest or ""),
        keys.workers(),
    ]


def stream_for(keys: Keys, spec: JobSpec, owner: bytes | str | None, affinity_routing: bool) -> str:
    """Batch work: the batch stream. Else the owner's own stream when routing is on and there is one,
    else the shared stream."""
    if spec.priority == "batch":
        return keys.batch_stream()
    if owner and affinity_routing:
        return keys.worker_stream(owner.decode() if isinstance(owner, bytes) else owner)
    return keys.inference_stream()


def needs_decoding(spec: JobSpec) -> bool:
    """A job with an image goes through a decode worker (its tensor, or the check that it is cached);
    a text-only job goes straight to inference."""
    return spec.image_digest is not None or any(turn.image for turn in spec.messages)


DECODE_SKIPPED = "decode_skipped"  # job hash field: handed to inference by the gateway, no pixels


def may_skip_decoding(spec: JobSpec) -> bool:
    """Interactive work with images and caches on: the gateway may hand it straight to a live worker
    that already decoded all its images (``ROUTE_HOLDER_LUA``), which sends it back to decoding
    when it does not hold them after all (``RETURN_TO_DECODING_LUA``)."""
    return needs_decoding(spec) and spec.priority != "batch" and spec.use_cache


def is_follow_up(spec: JobSpec) -> bool:
    """Its last turn shows no image: every image it shows was shown by an earlier turn (and so the
    session's worker decoded them all)."""
    last = spec.messages[-1] if spec.messages else None
    return last is not None and not (last.image or last.images)


def holder_scope(spec: JobSpec, shared: bool) -> str:
    """Whose decoded images a job may be handed over for: its tenant's own (a tenant must not learn
    from a 202 ``waiting`` that another sent the same picture), or everyone's where tenants share
    cached results (``VLMQ_RESULT_CACHE_SHARED``) or there are none ("")."""
    return "" if shared or spec.tenant is None else spec.tenant


def holder_keys(keys: Keys, spec: JobSpec, shared: bool) -> list[str]:
    """KEYS of ``ROUTE_HOLDER_LUA``: the workers' registry, the session owner, the owner of each
    image decoded (``Keys.image_input_owner`` in the job's ``holder_scope``)."""
    scope = holder_scope(spec, shared)
    holders = [keys.image_input_owner(scope, digest) for digest in spec.image_digests()]
    return [keys.workers(), keys.session_owner(spec.affinity_key or ""), *holders]
