"""The result cache's key: every knob that changes a greedy answer is in it, and nothing else."""

from __future__ import annotations

import hashlib
import json

from shared.result_cache import request_hash
from shared.schemas import ChatTurn, SamplingSpec

TURNS = [ChatTurn(role="user", text="What colour is the circle?", image=True)]


def test_min_tokens_and_ignore_eos_change_the_key_only_when_set() -> None:
    plain = request_hash("m", "d", TURNS, SamplingSpec(max_tokens=8))
    assert request_hash("m", "d", TURNS, SamplingSpec(max_tokens=8, min_tokens=4)) != plain
    assert request_hash("m", "d", TURNS, SamplingSpec(max_tokens=8, ignore_eos=True)) != plain
    # unset, they leave the key as the previous release computed it (its cached answers stay valid)
    before = {"max_tokens": 8, "temperature": 0.0, "stop": []}
    payload = {
        "tenant": None,
        "model": "m",
        "image": "d",
        "messages": [{"role": "user", "text": "What colour is the circle?", "image": True}],
        "sampling": before,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    assert plain == hashlib.sha256(canonical).hexdigest()
