"""The reference answer: the same checkpoint run batch-of-one without caches
(``Engine.generate_sync``) on the tensors the decode path makes from the same bytes."""

from __future__ import annotations

from typing import Any

from services.engine import Engine, EngineConfig
from services.inference_worker.engine_request import build_request, image_input
from services.vlm.image_processor import ImageProcessorHandle
from shared.config import DecodeWorkerSettings
from shared.schemas import JobSpec
from shared.tensors import pack_tensors, unpack_tensors
from worker.imaging import decode_image


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
        self.settings = DecodeWorkerSettings(_env_file=None)  # type: ignore[call-arg]
        self.engine.start()

    def tensors(self, data: bytes) -> dict[str, Any]:
        img = decode_image(
            data, self.settings.max_image_pixels, self.processor.target_pixels, draft=self.settings.jpeg_draft
        )
        return unpack_tensors(pack_tensors(self.processor(img)))  # the same float16 wire trip

    def answer(self, spec: JobSpec, data: bytes | None) -> str:
        image = image_input(self.tensors(data), spec.image_digest or "") if data is not None else None
        request = build_request(spec.model_copy(update={"use_cache": False}), f"ref-{spec.job_id}", image)
        request.deadline = None
        return "".join(e.text for e in self.engine.generate_sync(request, timeout_s=60))

    def close(self) -> None:
        self.engine.stop()
