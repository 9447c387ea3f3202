"""The processor's last steps as a table (``services.vlm.pixel_table``): equal to the processor's
own output bit for bit for every grid architecture the engine serves, refused where they are not a
table; the engine fed the uint8 picture (``pixels_on_device``), or the processor's values made
after the hand-over (``ProcessorPixels``), answers exactly as with the processor's pixel values,
alone and batched beside them."""

from __future__ import annotations

import copy
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bench.common import build_model, draw_image, image_input, load_bundled
from services.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from services.engine.api import FinishReason, ImageInput, RequestRejected
from services.inference_worker.engine_request import (
    ProcessorPixels,
    TablePixels,
    prepare_pictures,
    wire_input,
)
from services.vlm.image_processor import RESIZED, ImageProcessorHandle
from services.vlm.pixel_table import PixelTable
from shared.tensors import TensorCodecError
from tests.services.engine.reference import run_all
from tests.support import models
from tests.support.jobs import image_bytes
from worker.imaging import decode_image


def handle_of(name: str) -> ImageProcessorHandle:
    if name == "bundled":
        return ImageProcessorHandle.load(models.test_model_path())
    return ImageProcessorHandle.wrap(build_model(name)[1].image_processor)


@pytest.mark.parametrize("name", ["bundled", "glm4v", "qwen2_vl"])
def test_the_table_gives_the_processors_own_pixel_values(name: str) -> None:
    handle = handle_of(name)
    table = PixelTable.build(handle)
    assert table is not None, f"{name}: the processor's steps after its resize are not a table"
    for seed, (fmt, size) in enumerate([("JPEG", (333, 222)), ("PNG", (64, 300)), ("WEBP", (1024, 700))]):
        picture = handle.wire(decode_image(image_bytes(fmt, size, seed=seed), 10**8, handle.target_pixels))
        whole = handle.from_wire(picture)
        assert table.takes(picture[RESIZED])
        assert torch.equal(table.finish(picture[RESIZED]), whole["pixel_values"]), (name, fmt, size)
        assert torch.equal(table.grid(tuple(picture[RESIZED].shape)), whole["image_grid_thw"])


def test_a_patch_size_of_a_real_checkpoint_is_a_table_too() -> None:
    """GLM-4V's own 14 px patches on a 448 px picture (the bundled model's are 28 px)."""
    processor = copy.deepcopy(handle_of("bundled").processor)
    processor.patch_size = 14
    processor.size = {"shortest_edge": 12544, "longest_edge": 2 * 1024 * 1024}
    handle = ImageProcessorHandle.wrap(processor)
    table = PixelTable.build(handle)
    assert table is not None
    picture = np.random.default_rng(7).integers(0, 256, (3, 448, 448), dtype=np.uint8)
    assert torch.equal(table.finish(torch.from_numpy(picture)), handle.finish(picture)["pixel_values"])


def test_steps_that_depend_on_where_a_pixel_is_are_no_table() -> None:
    base = handle_of("bundled").processor

    class Vignetting(type(base)):  # type: ignore[misc]
        def rescale(self, image: Any, *args: Any, **kwargs: Any) -> Any:
            scaled = super().rescale(image, *args, **kwargs)
            return scaled + np.linspace(0, 0.01, scaled.shape[-1], dtype=scaled.dtype)

    processor = copy.copy(base)
    processor.__class__ = Vignetting
    handle = ImageProcessorHandle.wrap(processor)
    assert handle.split and PixelTable.build(handle) is None


def test_a_fixed_size_processor_has_no_table() -> None:
    assert PixelTable.build(handle_of("llava")) is None


def test_only_whole_uint8_pictures_are_taken() -> None:
    table = PixelTable.build(handle_of("bundled"))
    assert table is not None
    side = table.patch * table.merge
    assert table.takes(torch.zeros(3, side, 2 * side, dtype=torch.uint8))
    assert not table.takes(torch.zeros(3, side, 2 * side, dtype=torch.float32))
    assert not table.takes(torch.zeros(3, side + 1, side, dtype=torch.uint8))
    assert not table.takes(torch.zeros(4, side, side, dtype=torch.uint8))
    assert not table.takes(torch.zeros(side, side, dtype=torch.uint8))


@pytest.mark.parametrize("on_device", [True, False], ids=["table on the device", "processor, deferred"])
def test_the_engine_answers_the_same_from_the_uint8_picture(on_device: bool) -> None:
    """Caches off, so every request's picture goes through the vision tower: the deferred inputs'
    features and answers equal those of the processor's pixel values, alone and in one batch."""
    model, processor = load_bundled()
    engine = Engine(model, processor, EngineConfig(max_batch=8, prefix_cache=False, image_cache=False))
    pngs = [draw_image(seed, (96 + 32 * seed, 96)) for seed in range(4)]
    plain = [image_input(processor, png) for png in pngs]
    deferred = deferred_inputs(processor, pngs, plain, on_device)
    kind = TablePixels if on_device else ProcessorPixels
    assert all(d.pixel_values is None and isinstance(d.deferred, kind) for d in deferred)
    for a, b in zip(plain, deferred, strict=True):
        assert torch.equal(engine.arch.encode_images([a])[0], engine.arch.encode_images([b])[0])
    deferred = deferred_inputs(processor, pngs, plain, on_device)  # none made yet
    engine.start()
    try:
        alone = [tokens(engine.generate_sync(request(f"plain-{i}", im), 60)) for i, im in enumerate(plain)]
        assert [
            tokens(engine.generate_sync(request(f"deferred-{i}", im), 60)) for i, im in enumerate(deferred)
        ] == alone
        mixed = [plain[0], deferred[1], deferred[2], plain[3]]
        batched = run_all(engine, [request(f"mixed-{i}", im) for i, im in enumerate(mixed)])
        assert [tokens(batched[f"mixed-{i}"]) for i in range(4)] == alone
    finally:
        engine.stop(drain_timeout_s=5)


def deferred_inputs(
    processor: Any, pngs: list[bytes], plain: list[ImageInput], on_device: bool
) -> list[ImageInput]:
    """The pictures as the inference worker hands them to the engine (``wire_input``)."""
    handle = ImageProcessorHandle.wrap(processor.image_processor)
    handle.table, handle.finish_on_device = PixelTable.build(handle), on_device
    return [
        wire_input(handle, handle.wire(Image.open(io.BytesIO(png)).convert("RGB")), p.digest)
        for png, p in zip(pngs, plain, strict=True)
    ]


def test_deferred_processor_pixels_are_made_once_by_the_first_thread_that_asks() -> None:
    """The worker's main thread finishes a submitted picture while the engine renders the prompt;
    the engine's encode then takes those values (or makes them itself, if it gets there first)."""
    _model, processor = load_bundled()
    png = draw_image(7, (128, 96))
    (made,) = deferred_inputs(processor, [png], [image_input(processor, png)], on_device=False)
    pixels = made.deferred
    assert isinstance(pixels, ProcessorPixels)
    want = image_input(processor, png).pixel_values
    assert want is not None and pixels.shape == tuple(want.shape)
    barrier = threading.Barrier(4)

    def ask() -> torch.Tensor:
        barrier.wait()
        return pixels.make(torch.device("cpu"))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: ask(), range(4)))
    assert all(r is results[0] for r in results)  # one finishing, shared
    assert torch.equal(results[0], want)


def test_a_picture_that_cannot_be_finished_fails_its_own_request_only() -> None:
    """``prepare_pictures`` says which request has a picture the processor cannot finish (the
    worker rejects it before a busy engine gets it); one already submitted fails in the engine,
    whose ``make`` raises the same error, not a second try: the batched prefill isolates that
    request, and the one beside it is answered as alone."""
    model, processor = load_bundled()
    engine = Engine(model, processor, EngineConfig(max_batch=4, prefix_cache=False, image_cache=False))
    png = draw_image(3, (96, 96))
    plain = image_input(processor, png)
    (good,) = deferred_inputs(processor, [png], [plain], on_device=False)
    assert isinstance(good.deferred, ProcessorPixels)
    # two channels where the processor wants three: its steps raise (the shape claimed still fits)
    broken = ProcessorPixels(good.deferred.handle, good.deferred.picture[:2], good.deferred.shape)
    bad = replace(good, deferred=broken, digest="f" * 64)
    reqs = [request("good", good), request("bad", bad)]
    good_why, bad_why = prepare_pictures(reqs)
    assert good_why is None
    assert isinstance(bad_why, TensorCodecError) and "decoded image unreadable" in str(bad_why)
    with pytest.raises(TensorCodecError) as again:
        broken.make(torch.device("cpu"))
    assert again.value is bad_why  # the failure kept, the processor not run again
    engine.start()
    try:
        answers = run_all(engine, reqs)
    finally:
        engine.stop(drain_timeout_s=5)
    assert tokens(answers["good"]) == tokens(engine_alone(model, processor, plain))
    assert answers["bad"][-1].finish_reason is FinishReason.ERROR
    assert "decoded image unreadable" in (answers["bad"][-1].error or "")


def engine_alone(model: Any, processor: Any, image: ImageInput) -> list[TokenEvent]:
    engine = Engine(model, processor, EngineConfig(max_batch=1, prefix_cache=False, image_cache=False))
    engine.start()
    try:
        return engine.generate_sync(request("alone", image), 60)
    finally:
        engine.stop(drain_timeout_s=5)


def request(request_id: str, image: ImageInput) -> GenerationRequest:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    return GenerationRequest(request_id, messages, [image], SamplingParams(max_tokens=8), use_cache=False)


def tokens(events: list[TokenEvent]) -> list[int]:
    assert events[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH), events[-1].error
    return [t for event in events for t in event.token_ids]


def test_the_engine_refuses_deferred_pixels_that_do_not_fit_the_grid() -> None:
    model, processor = load_bundled()
    handle = ImageProcessorHandle.wrap(processor.image_processor)
    handle.table = table = PixelTable.build(handle)
    handle.finish_on_device = True
    assert table is not None
    engine = Engine(model, processor, EngineConfig(max_batch=2))
    picture = handle.wire(Image.open(io.BytesIO(draw_image(5, (96, 96)))).convert("RGB"))
    good = wire_input(handle, picture, "e" * 64)
    engine.validate(request("good", good))
    wider = torch.tensor([[1, int(good.image_grid_thw[0, 1]), int(good.image_grid_thw[0, 2]) + 2]])
    for bad in (replace(good, image_grid_thw=wider), replace(good, deferred=None)):
        with pytest.raises(RequestRejected):
            engine.validate(request("bad", bad))
