"""Workloads and load generators for the engine benchmark: prepared requests, a naive server that
runs ``model.generate`` per request, closed-loop clients, and a bare batched forward loop."""

from __future__ import annotations

import io
import itertools
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from bench.common import draw_image, image_input
from services.engine import Engine, FinishReason, GenerationRequest, SamplingParams, TokenEvent

QUESTIONS = [
    "What colour is the circle?",
    "How many shapes are there?",
    "Where is the red square?",
    "What shape is the big one?",
    "Is the star left or right of the circle?",
    "What is written?",
    "What colour is the small shape?",
    "How many circles are there?",
]
_ids = itertools.count()
Done = Callable[["str | None"], None]  # a request ended: None, or why it failed


@dataclass
class Item:
    """One request of the workload, in both forms: engine request and processor inputs for generate."""

    messages: list[dict[str, Any]]
    images: list[Any]
    pngs: list[bytes]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    def request(self, sampling: SamplingParams, **kw: Any) -> GenerationRequest:
        return GenerationRequest(f"b{next(_ids)}", self.messages, self.images, sampling, **kw)


def user(text: str, image: bool = True) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image"}] if image else []
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def make_items(
    processor: Any, n: int, seed: int = 0, size: tuple[int, int] = (96, 96), same_image: bool = False
) -> list[Item]:
    """``n`` requests, each with its own image (or one shared image) and a question from the pool."""
    shared = draw_image(seed, size)
    items = []
    for i in range(n):
        png = shared if same_image else draw_image(seed * 100_003 + i, size)
        items.append(_item(processor, [user(QUESTIONS[i % len(QUESTIONS)])], png))
    return items


def make_conversations(processor: Any, n: int, seed: int = 0) -> list[list[Item]]:
    """``n`` two-turn conversations about a new image each: a question, then a follow-up sent with
    the whole history (the first answer fixed to "red": clients may send any history)."""
    convs = []
    for i, first in enumerate(make_items(processor, n, seed)):
        history = [
            *first.messages,
            {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
            user(FOLLOW_UPS[i % len(FOLLOW_UPS)], image=False),
        ]
        convs.append([first, _item(processor, history, first.pngs[0])])
    return convs


FOLLOW_UPS = ["And where is it?", "What shape is it?", "Is it big or small?", "And its colour?"]


def _item(processor: Any, msgs: list[dict[str, Any]], png: bytes) -> Item:
    text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    pil = Image.open(io.BytesIO(png)).convert("RGB")
    inputs = dict(processor(text=[text], images=[pil], return_tensors="pt"))
    return Item(msgs, [image_input(processor, png)], [png], inputs)


class NaiveServer:
    """Baseline (a): one model, requests served one at a time with ``model.generate``."""

    def __init__(self, model: Any, max_new_tokens: int) -> None:
        self.model = model
        self.max_new = max_new_tokens
        self.q: queue.Queue[tuple[Item, Done] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, item: Item, session_id: str | None, done: Done) -> None:
        self.q.put((item, done))  # no state kept between turns: every turn recomputes its history

    def _run(self) -> None:
        while (job := self.q.get()) is not None:
            item, done = job
            with torch.inference_mode():
                self.model.generate(**item.inputs, max_new_tokens=self.max_new, do_sample=False)
            done(None)

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


Submit = Callable[[Item, "str | None", Done], None]


def engine_submitter(engine: Engine, sampling: SamplingParams) -> Submit:
    def submit(item: Item, session_id: str | None, done: Done) -> None:
        def on_event(ev: TokenEvent) -> None:
            if ev.finish_reason in (FinishReason.REJECTED, FinishReason.ERROR):
                done(f"{ev.request_id} ended {ev.finish_reason}: {ev.error}")
            elif ev.finished:
                done(None)

        engine.submit(item.request(sampling, session_id=session_id), on_event)

    return submit


@dataclass
class LoadResult:
    clients: int
    requests: int
    seconds: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def to_dict(self) -> dict[str, float]:
        return {
            "clients": self.clients,
            "requests": self.requests,
            "seconds": self.seconds,
            "req_per_s": self.throughput,
            "p50_s": self.pct(0.5),
            "p99_s": self.pct(0.99),
            "mean_s": statistics.fmean(self.latencies),
        }


class Ended(threading.Event):
    """A ``Done`` callback a client waits on; it keeps why the request failed, if it did."""

    error: str | None = None

    def __call__(self, error: str | None) -> None:
        self.error = error
        self.set()


def closed_loop(submit: Submit, convs: list[list[Item]], clients: int, total: int) -> LoadResult:
    """``clients`` threads, each sending its next request as soon as the previous one finished; a
    conversation's turns go in order under one session id. ``total`` conversations in all."""
    feed: Iterator[int] = iter(range(total))
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []

    def client() -> None:
        while True:
            with lock:
                i = next(feed, None)
            if i is None:
                return
            sid = f"conv-{next(_ids)}"
            for item in convs[i % len(convs)]:
                ended = Ended()
                t0 = time.perf_counter()
                submit(item, sid, ended)
                ended.wait()
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    if ended.error:
                        failures.append(ended.error)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:  # a bench that counts failed requests as served measures nothing
        raise RuntimeError(f"{len(failures)} requests failed, e.g. {failures[0]}")
    return LoadResult(clients, len(latencies), time.perf_counter() - t0, latencies)


def timed_events(engine: Engine, reqs: list[GenerationRequest]) -> dict[str, list[tuple[float, TokenEvent]]]:
    """Submit all at once; every event with its arrival time."""
    out: dict[str, list[tuple[float, TokenEvent]]] = {r.request_id: [] for r in reqs}
    left = threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        out[ev.request_id].append((time.perf_counter(), ev))
        if ev.finished:
            left.release()

    for r in reqs:
        engine.submit(r, on_event)
    for _ in reqs:
        left.acquire()
    return out


@torch.inference_mode()
def bare_decode_tok_s(model: Any, item: Item, batch: int, steps: int) -> float:
    """Reference loop: one batched prefill, then ``steps`` plain forwards of (batch, 1) tokens with a
    DynamicCache and explicit 3-D positions, argmax between them. No scheduling, no padding."""
    from transformers import DynamicCache

    inp = {k: torch.cat([v] * batch) for k, v in item.inputs.items()}
    cache = DynamicCache(config=model.config)
    out = model(**inp, cache=cache, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    length = inp["input_ids"].shape[1]
    pos = (torch.arange(length, length + 1) + model.model.rope_deltas).view(1, batch, 1).expand(3, -1, -1)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=nxt, position_ids=pos, cache=cache)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = pos + 1
    return batch * steps / (time.perf_counter() - t0)
