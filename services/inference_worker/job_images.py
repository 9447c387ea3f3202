"""A job's images as the engine takes them: those the worker holds (``image_inputs``), else from the
pixels its decode worker stored (or, while a previous release's decode workers still run, from
their tensor of its one image)."""

from __future__ import annotations

from services.engine.api import ImageInput
from services.inference_worker.engine_request import needs_image, pixels_inputs
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
    made from pixels are kept in ``held`` for later turns (jobs with caches on only)."""
    digests = spec.image_digests()
    if not needs_image(spec):
        return {}
    if not digests:
        raise LookupError("the conversation refers to an image but the job has none")
    found = held.get_all(digests) if spec.use_cache else None
    if found is not None:
        return found
    if skipped and pixels is None:
        raise PixelsNeeded(f"{len(digests)} image(s), not all held here")
    images = _decoded(store, processor, spec.image_digest, digests, pixels)
    if spec.use_cache and pixels is not None:  # a previous release's float16 tensor: not kept
        held.put_all(images)
    return images


def _decoded(
    store: JobStore,
    processor: ImageProcessorHandle,
    legacy: str | None,
    digests: list[str],
    pixels: bytes | None,
) -> dict[str, ImageInput]:
    if pixels is None and legacy is not None and digests == [legacy]:
        return {legacy: store.legacy_image(legacy, processor.processor_id)}
    if pixels is None:
        raise LookupError("the job's decoded images are gone; submit the images again")
    return pixels_inputs(processor, pixels, digests)
