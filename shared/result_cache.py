"""Greedy result cache (docs/service-contract.md "Result cache"): key derivation and record.

Written by the inference worker when a cacheable job is done; read by the gateway before it
enqueues anything. Only greedy jobs with ``use_cache`` are cacheable: the same input then
always gives the same text, so a hit is indistinguishable from a fresh run.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec, SamplingSpec, UsageInfo


class CachedResult(BaseModel):
    text: str
    usage: UsageInfo
    finish_reason: str


def request_hash(
    model_name: str, image_digest: str | None, messages: list[ChatTurn], sampling: SamplingSpec
) -> str:
    """sha256 over everything that determines a greedy answer (canonical JSON)."""
    payload = {
        "model": model_name,
        "image": image_digest,
        "messages": [m.model_dump(mode="json") for m in messages],
        "sampling": sampling.model_dump(mode="json", exclude={"seed"}),  # seed is irrelevant when greedy
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def cacheable(spec: JobSpec) -> bool:
    return spec.use_cache and spec.sampling.greedy


def cache_key(keys: Keys, model_name: str, spec: JobSpec) -> str | None:
    """Redis key of ``spec``'s cached result, or None when the job is not cacheable."""
    if not cacheable(spec):
        return None
    return keys.result_cache(request_hash(model_name, spec.image_digest, spec.messages, spec.sampling))


def encode(result: CachedResult) -> str:
    return result.model_dump_json()


def decode(raw: bytes | str | None) -> CachedResult | None:
    """Parse a cached record; None when missing or unreadable (treated as a miss)."""
    if raw is None:
        return None
    try:
        return CachedResult.model_validate_json(raw)
    except ValueError:
        return None
