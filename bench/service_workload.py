"""Service benchmark workload and statistics: JPEG photos 320-1024 px of the tiny model's
world (``tinyvlm`` scenes), one question each, and percentile helpers."""

from __future__ import annotations

import base64
import dataclasses
import random
import statistics
from dataclasses import dataclass
from typing import Any

from tinyvlm.questions import conversation
from tinyvlm.render import encode, render
from tinyvlm.scene import sample_scene

MAX_TOKENS = 16


@dataclass(frozen=True)
class BenchRequest:
    index: int
    image: bytes  # JPEG file bytes
    question: str
    width: int
    height: int
    answer: str = ""  # the right answer (the scene's ground truth)

    @property
    def data_url(self) -> str:
        return "data:image/jpeg;base64," + base64.b64encode(self.image).decode()

    def openai_messages(self) -> list[dict[str, Any]]:
        return [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": self.data_url}},
                    {"type": "text", "text": self.question},
                ],
            }
        ]


def make_requests(count: int, seed: int = 0) -> list[BenchRequest]:
    """``count`` distinct photos (sides 320..1024, aspect <= 2) with one question each."""
    rng = random.Random(seed)
    out: list[BenchRequest] = []
    while len(out) < count:
        scene = sample_scene(rng)
        width, height = rng.randint(320, 1024), rng.randint(320, 1024)
        if max(width, height) / min(width, height) > 2:
            continue
        scene = dataclasses.replace(
            scene, width=width, height=height, fmt="jpeg", quality=rng.randint(80, 95)
        )
        turns = conversation(scene, rng)
        image = encode(render(scene, seed=len(out)), scene)
        out.append(BenchRequest(len(out), image, turns[0].question, width, height, turns[0].answer))
    return out


@dataclass
class Sample:
    """One request as the client saw it (seconds), plus what the server reported."""

    index: int
    e2e: float
    ttft: float | None
    text: str
    timings: dict[str, float] | None = None
    error: str | None = None
    job_id: str | None = None  # vlmq's job id (WebSocket runs)
    sent_at: float | None = None  # wall clock (time.time()) when the request was sent
    completion_tokens: int | None = None  # as the server's usage said (OpenAI runs), if it said


def pct(values: list[float], q: float) -> float | None:
    """Percentile by nearest rank (q in 0..100); None for no data."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(samples: list[Sample], wall_s: float, ramp: int = 0) -> dict[str, Any]:
    """Counts, throughput and percentiles; ``ramp``: the closed loop's clients (its first ``ramp``
    requests, sent at once by clients starting together, are also left out of ``e2e_p99_after_ramp``:
    a cold pipeline's burst, not the steady state)."""
    ok = [s for s in samples if s.error is None]
    e2e = [s.e2e for s in ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    summary: dict[str, Any] = {
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "qps": len(ok) / wall_s if wall_s > 0 else None,
        "e2e_p50": pct(e2e, 50),
        "e2e_p90": pct(e2e, 90),
        "e2e_p99": pct(e2e, 99),
        "e2e_p99_after_ramp": pct([s.e2e for s in ok if s.index >= ramp], 99),
        "ttft_p50": pct(ttft, 50),
        "ttft_p90": pct(ttft, 90),
        "ttft_p99": pct(ttft, 99),
    }
    stages = [s.timings for s in ok if s.timings]
    if stages:
        summary["stages_p50"] = {k: statistics.median(t[k] for t in stages) for k in stages[0]}
    return summary
