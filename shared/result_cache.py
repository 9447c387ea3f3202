"""Greedy result cache (docs/service-contract.md "Result cache"): key derivation and record.

Written by the inference worker when a cacheable job is done; read by the gateway before it
enqueues anything. Only greedy jobs with ``use_cache`` are cacheable: the same input then
always gives the same text, so a hit is indistinguishable from a fresh run.

The key names the exact weights that answered (``model_identity``: checkpoint path, a
fingerprint of its files, quantization), so a retrained checkpoint under the same name, or
another quantization, never serves an old answer.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec, SamplingSpec, UsageInfo

FINGERPRINT_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json")


class CachedResult(BaseModel):
    text: str
    usage: UsageInfo
    finish_reason: str


@lru_cache(maxsize=8)
def checkpoint_fingerprint(model_path: str) -> str:
    """Hash of the small config files plus (name, size, mtime) of every weight file; "missing" if absent."""
    root = Path(model_path)
    if not root.is_dir():
        return "missing"
    digest = hashlib.sha256()
    for name in FINGERPRINT_FILES:
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    for weights in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def model_identity(model_path: str, quantize: str) -> str:
    """What answered: checkpoint path, its fingerprint, quantization (computed once per path)."""
    resolved = str(Path(model_path).resolve())
    return f"{resolved}|{checkpoint_fingerprint(resolved)}|{quantize}"


def request_hash(
    model_id: str,
    image_digest: str | None,
    messages: list[ChatTurn],
    sampling: SamplingSpec,
    tenant: str | None = None,
) -> str:
    """sha256 over everything that determines a greedy answer (canonical JSON).

    Greedy decoding ignores seed, top_p and top_k: they are left out of the key; ``min_tokens``,
    ``ignore_eos`` and ``response_format`` only when set (keys of earlier releases stay valid).
    """
    knobs = sampling.model_dump(mode="json", exclude={"seed", "top_p", "top_k"})
    for name, default in (("min_tokens", 0), ("ignore_eos", False), ("response_format", None)):
        if knobs[name] == default:
            del knobs[name]
    payload = {
        "tenant": tenant,
        "model": model_id,
        "image": image_digest,
        "messages": [_turn_fields(m) for m in messages],
        "sampling": knobs,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _turn_fields(turn: ChatTurn) -> dict[str, Any]:
    """A turn as the key sees it: without images, or with its images before its text, it hashes
    as before multi-image and interleaved turns existed (earlier releases' keys stay valid)."""
    exclude = set() if turn.images else {"images"}
    if not any(turn.image_at):
        exclude.add("image_at")
    return turn.model_dump(mode="json", exclude=exclude)


def cacheable(spec: JobSpec) -> bool:
    return spec.use_cache and spec.sampling.greedy


def cache_key(keys: Keys, model_id: str, spec: JobSpec, shared: bool = False) -> str | None:
    """Redis key of ``spec``'s cached result (``model_id`` from ``model_identity``), or None.
    ``shared``: tenants hit each other's answers (else each tenant's cache is its own)."""
    if not cacheable(spec):
        return None
    tenant = None if shared else spec.tenant
    return keys.result_cache(request_hash(model_id, spec.image_digest, spec.messages, spec.sampling, tenant))


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
