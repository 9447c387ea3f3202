"""A job's images as the engine takes them: those the worker holds (``image_inputs``), else from the
pixels its decode worker stored (or, while a previous release's decode workers still run, from
their tensor of its one image)."""

from __future__ import annotations

from services.engine.api import ImageInput
from services.inference_worker.engine_request import needs_image, unpack_wires, wire_inputs
from services.inference_worker.image_inputs import ImageInputCache, PixelsNeeded
from services.inference_worker.job_store import JobStore
from services.vlm.image_processor import ImageProcessorHandle
from shared.schemas import JobSpec


def job_images(
    held: ImageInputCache,
    store: JobStore,
    processor: ImageProcessorHandle,
    spec: JobSpec,
    pixels: bytes | None,
    skipped: bool,
) -> dict[str, ImageInput]:
    """The job's images by digest. ``skipped``: handed over without pixels (PixelsNeeded when they
    are not all held); LookupError when they are gone, TensorCodecError when unreadable. Images
    made from pixels are kept in ``held``, as shipped, for later turns (jobs with caches on only)."""
    digests = spec.image_digests()
    if not needs_image(spec):
        return {}
    if not digests:
        raise LookupError("the conversation refers to an image but the job has none")
    found = held.get_all(digests) if spec.use_cache else None
    if found is not None:
        return wire_inputs(processor, found)
    if skipped and pixels is None:
        raise PixelsNeeded(f"{len(digests)} image(s), not all held here")
    if pixels is None:
        return _legacy(store, processor, spec.image_digest, digests)
    wires = unpack_wires(processor, pixels, digests)
    images = wire_inputs(processor, wires)
    if spec.use_cache:
        held.put_all(wires)
    return images


def _legacy(
    store: JobStore, processor: ImageProcessorHandle, legacy: str | None, digests: list[str]
) -> dict[str, ImageInput]:
    """A job without pixels of its own: a previous release's float16 tensor of its one image (never
    kept), else LookupError."""
    if legacy is not None and digests == [legacy]:
        return {legacy: store.legacy_image(legacy, processor.processor_id)}
    raise LookupError("the job's decoded images are gone; submit the images again")
