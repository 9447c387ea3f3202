"""From-scratch references for the exactness tests: batch-of-one ``model.generate`` of the
conversation rendered by the chat template, with the processor's own image-token expansion."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from bench.common import TinyProcessor
from services.engine import GenerationRequest, TokenEvent


@dataclass
class Reference:
    tokens: list[int]
    logits: list[torch.Tensor]  # per generated step, (V,)


def _tiny_inputs(model: Any, processor: TinyProcessor, text: str, imgs: list[Image.Image]) -> dict[str, Any]:
    """What the HF processor of the family does: one placeholder -> N image tokens (string level)."""
    tok = processor.tokenizer
    image_token = tok.convert_ids_to_tokens(model.config.image_token_id)
    kw: dict[str, Any] = {}
    if imgs:
        pix = processor.image_processor(images=imgs, return_tensors="pt")
        grid = pix.get("image_grid_thw")
        counts = (
            [int(g.prod()) // 4 for g in grid]
            if grid is not None
            else [(model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2]
            * len(imgs)
        )
        parts = text.split(image_token)
        text = parts[0] + "".join(image_token * n + p for n, p in zip(counts, parts[1:], strict=True))
        kw["pixel_values"] = pix["pixel_values"]
        if grid is not None:
            kw["image_grid_thw"] = grid
    ids = torch.tensor([tok(text)["input_ids"]])  # as the HF processors call the tokenizer
    if "image_grid_thw" in kw:
        kw["mm_token_type_ids"] = (ids == model.config.image_token_id).int()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **kw}


def reference(
    model: Any,
    processor: Any,
    messages: list[dict[str, Any]],
    pngs: list[bytes],
    max_new: int,
    min_new: int = 0,
    logits_processor: list[Any] | None = None,
) -> Reference:
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    imgs = [Image.open(io.BytesIO(b)).convert("RGB") for b in pngs]
    if isinstance(processor, TinyProcessor):
        inputs = _tiny_inputs(model, processor, text, imgs)
    else:
        inputs = dict(processor(text=[text], images=imgs or None, return_tensors="pt"))
    inputs = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            max_new_tokens=max_new,
            min_new_tokens=min_new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            logits_processor=logits_processor,
        )
    n = inputs["input_ids"].shape[1]
    return Reference(out.sequences[0, n:].tolist(), [lg[0].float() for lg in out.logits])


def tokens_of(events: list[TokenEvent]) -> list[int]:
    assert events and events[-1].finished and sum(e.finished for e in events) == 1
    return [t for e in events for t in e.token_ids]


def assert_greedy_match(got: list[int], ref: Reference, tie_tol: float = 0.0, what: str = "") -> None:
    """Token-identical, or (random weights only, ``tie_tol`` > 0) diverging first at a step where the
    reference's top two logits are within ``tie_tol`` — a near tie either answer is right for."""
    if got == ref.tokens:
        return
    n = next((i for i, (a, b) in enumerate(zip(got, ref.tokens, strict=False)) if a != b), None)
    assert n is not None, f"{what}: lengths differ {len(got)} vs {len(ref.tokens)}: {got} vs {ref.tokens}"
    top2 = ref.logits[n].topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap <= tie_tol, f"{what}: diverged at token {n} (logit gap {gap:.2e}): {got} vs {ref.tokens}"


def check(
    engine_events: list[TokenEvent],
    model: Any,
    processor: Any,
    req: GenerationRequest,
    pngs: list[bytes],
    tie_tol: float = 0.0,
) -> None:
    sampling = req.sampling
    ref = reference(model, processor, req.messages, pngs, sampling.max_tokens, sampling.min_tokens)
    got = tokens_of(engine_events)
    if req.sampling.ignore_eos and len(ref.tokens) < len(got):  # generate stopped at EOS; we went on
        got = got[: len(ref.tokens)]
    assert_greedy_match(got, ref, tie_tol, req.request_id)


def user(text: str, image: bool = True) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image"}] if image else []
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def run_all(engine: Any, reqs: list[GenerationRequest], timeout_s: float = 60) -> dict[str, list[TokenEvent]]:
    """Submit every request at once (they batch) and wait for all final events."""
    import threading

    events: dict[str, list[TokenEvent]] = {r.request_id: [] for r in reqs}
    left = threading.Semaphore(0)

    def on_event(ev: TokenEvent) -> None:
        events[ev.request_id].append(ev)
        if ev.finished:
            left.release()

    for r in reqs:
        engine.submit(r, on_event)
    for _ in reqs:
        assert left.acquire(timeout=timeout_s), "engine did not finish in time"
    return events
