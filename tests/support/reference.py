"""The reference answer: the same checkpoint run batch-of-one without caches
(``Engine.generate_sync``) on the pixels the decode path makes from the same bytes."""

from __future__ import annotations

import hashlib

from services.engine import Engine, EngineConfig
from services.engine.api import ImageInput
from services.inference_worker.engine_request import build_request, pixels_input
from services.vlm.image_processor import ImageProcessorHandle
from shared.config import DecodeWorkerSettings
from shared.schemas import JobSpec
from shared.tensors import pack_image
from worker.imaging import decode_image


def decoded_image(handle: ImageProcessorHandle, data: bytes, digest: str | None = None) -> ImageInput:
    """What the inference worker hands the engine for ``data``: decoded and resized as the decode
    worker does it, over the same wire, finished by the processor as the inference worker does it."""
    settings = DecodeWorkerSettings(_env_file=None)  # type: ignore[call-arg]
    img = decode_image(
        data,
        settings.max_image_pixels,
        handle.target_pixels,
        draft=settings.jpeg_draft,
        oversample=settings.jpeg_draft_oversample,
    )
    payload = pack_image(handle.processor_id, handle.wire(img))
    return pixels_input(handle, payload, digest or hashlib.sha256(data).hexdigest())


class Reference:
    """What the engine alone answers for a job spec and its image bytes."""

    def __init__(self, model_path: str) -> None:
        self.engine = Engine.from_pretrained(
            EngineConfig(
                model_path=model_path,
                device="cpu",
                prefix_cache=False,
                session_cache=False,
                image_cache=False,
            )
        )
        self.processor = ImageProcessorHandle.load(model_path)
        self.engine.start()

    def answer(self, spec: JobSpec, data: bytes | list[bytes] | None) -> str:
        """``data``: the job's one image, or every image it shows (any order), or None."""
        images: dict[str, ImageInput] | ImageInput | None = None
        if isinstance(data, bytes):
            images = decoded_image(self.processor, data, spec.image_digest)
        elif data is not None:
            images = {i.digest: i for i in (decoded_image(self.processor, d) for d in data)}
        request = build_request(spec.model_copy(update={"use_cache": False}), f"ref-{spec.job_id}", images)
        request.deadline = None
        return "".join(e.text for e in self.engine.generate_sync(request, timeout_s=60))

    def close(self) -> None:
        self.engine.stop()
