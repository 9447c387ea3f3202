"""Eval answers through the serving engine (``services.engine``), not ``model.generate``.

What the service answers is what is measured, and it is several times faster: the prefix cache
shares the system prompt's KV, the session cache each conversation's earlier turns, the image
cache a picture's features across turns, and continuous batching keeps the batch full. The
engine's output is token-identical to an uncached batch-of-one run (its exactness tests);
``model.generate`` on a left-padded batch can differ from both at near ties.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from typing import Any

from services.engine import Engine, GenerationRequest, SamplingParams, TokenEvent
from services.engine.api import ImageInput
from services.engine.config import EngineConfig
from tinyvlm import data
from tinyvlm.questions import Turn

ANSWER_TOKENS = 6  # every answer but JSON fits (answers are one or two words and an EOS)
JSON_ANSWER_TOKENS = 14


class EngineAnswerer:
    """Greedy answers for whole conversations, turn by turn, each turn's history holding the
    model's own earlier answers (like a real client)."""

    def __init__(self, model: Any, processor: Any, max_batch: int = 48) -> None:
        config = EngineConfig(max_batch=max_batch, batch_window_ms=0.0, session_ttl_s=3600.0)
        self.engine = Engine(model, processor, config)
        self.processor = processor
        self.engine.prewarm()  # the default system prompt's KV, shared by every conversation
        self.engine.start()

    def close(self) -> None:
        self.engine.stop()

    def run_conversations(
        self,
        convs: list[list[Turn]],
        images: list[Any],
        systems: list[str | None] | None = None,
        text_first: list[bool] | None = None,
    ) -> list[list[str]]:
        systems = systems or [None] * len(convs)
        layouts = text_first or [False] * len(convs)
        pictures = [self.image_input(image) for image in images]
        sessions = [uuid.uuid4().hex for _ in convs]
        answers: list[list[str]] = [[] for _ in convs]
        for turn in range(max(len(turns) for turns in convs)):
            live = [i for i, turns in enumerate(convs) if len(turns) > turn]
            requests = [
                self.request(
                    convs[i][: turn + 1], answers[i], systems[i], pictures[i], sessions[i], layouts[i]
                )
                for i in live
            ]
            for i, text in zip(live, self.answer_all(requests), strict=True):
                answers[i].append(text)
        return answers

    def request(
        self,
        turns: list[Turn],
        given: list[str],
        system: str | None,
        picture: ImageInput,
        session: str,
        text_first: bool = False,
    ) -> GenerationRequest:
        history = data.messages(turns, True, system, text_first)[:-1]  # not this turn's gold
        offset = 0 if system is None else 1
        for k, answer in enumerate(given):
            history[offset + 2 * k + 1]["content"] = answer
        tokens = JSON_ANSWER_TOKENS if turns[-1].json else ANSWER_TOKENS
        return GenerationRequest(
            uuid.uuid4().hex, history, [picture], SamplingParams(max_tokens=tokens), session_id=session
        )

    def answer_all(self, requests: list[GenerationRequest]) -> list[str]:
        """Submit every request at once; the engine batches them. Their texts, stripped, in order."""
        if not requests:
            return []
        texts: dict[str, list[str]] = {r.request_id: [] for r in requests}
        errors: list[str] = []
        remaining = [len(requests)]
        done = threading.Event()
        lock = threading.Lock()

        def on_event(event: TokenEvent) -> None:
            texts[event.request_id].append(event.text)
            if event.finished:
                with lock:
                    if event.error:
                        errors.append(event.error)
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()

        refused = self.engine.submit_many([(r, on_event) for r in requests])
        if any(refused):
            raise RuntimeError(f"the engine refused an eval request: {next(r for r in refused if r)}")
        done.wait()
        if errors:
            raise RuntimeError(f"{len(errors)} eval requests failed, e.g. {errors[0]}")
        return ["".join(texts[r.request_id]).strip() for r in requests]

    def image_input(self, image: Any) -> ImageInput:
        """The image processor's tensors, as the decode worker hands them over; the digest keys the
        engine's image cache (one picture, encoded once for all its turns)."""
        out = self.processor.image_processor(images=[image], return_tensors="pt")
        extra = {k: v for k, v in out.items() if k not in ("pixel_values", "image_grid_thw")}
        digest = hashlib.sha256(image.tobytes() + repr(image.size).encode()).hexdigest()
        return ImageInput(out["pixel_values"], out["image_grid_thw"], digest, extra)
