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


def skips_decoding(spec: JobSpec) -> bool:
    """A turn that shows no new image, of interactive work with caches on: the gateway may hand it
    straight to the live worker that holds its images (``ROUTE_HOLDER_LUA``), which sends it back
    to decoding when it does not hold them after all (``RETURN_TO_DECODING_LUA``)."""
    last = spec.messages[-1] if spec.messages else None
    shows_new = last is None or bool(last.image or last.images)
    return needs_decoding(spec) and not shows_new and spec.priority != "batch" and spec.use_cache
